"""A realistic simulated fleet that talks to the console exactly as real agents do (HTTP + token).

Shape: a few sites of real GPU models (H100, H200, A100, L40S). Training nodes hold their GPUs
near 100 %; inference nodes follow a diurnal curve in the site's local time. Occasional faults
are the kind later detectors catch: XID 79 (fallen off the bus), double-bit ECC with row
remapping, and thermal throttling (temperature at its limit, SM clock pulled down).
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import requests

# NVML clocks-event reason bits (nvmlClocksEventReason*).
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_HW_THERMAL = 0x40


@dataclass(frozen=True)
class GpuModel:
    name: str
    hbm_mib: int
    tdp_w: float
    idle_w: float
    sm_clock_max: float
    mem_clock: float
    slowdown_temp: float
    bf16_tflops: float  # dense BF16 peak (TFLOP/s): what model FLOPs utilisation divides by


# Dense BF16 peaks from NVIDIA's data sheets (the sparse figures are twice these): H100 SXM and H200
# 989 TFLOP/s (the same compute; the H200 has more and faster memory), A100 312, L40S 362.
H100 = GpuModel("NVIDIA H100 80GB HBM3", 81559, 700, 70, 1980, 2619, 87, 989)
H200 = GpuModel("NVIDIA H200", 143771, 700, 75, 1980, 3201, 87, 989)
A100 = GpuModel("NVIDIA A100-SXM4-80GB", 81920, 400, 55, 1410, 1593, 85, 312)
L40S = GpuModel("NVIDIA L40S", 46068, 350, 35, 2520, 9001, 88, 362)


@dataclass(frozen=True)
class NodeGroup:
    prefix: str
    model: GpuModel
    nodes: int
    gpus_per_node: int
    workload: str  # "training" or "inference"
    instance_type: str


@dataclass(frozen=True)
class SiteSpec:
    name: str
    region: str
    utc_offset_h: int
    contracted_power_kw: int
    groups: tuple[NodeGroup, ...]


DEFAULT_SITES = (
    SiteSpec(
        "ams-1",
        "eu-west",
        1,
        520,
        (
            NodeGroup("ams1-h100", H100, 16, 8, "training", "DGX H100"),
            NodeGroup("ams1-l40s", L40S, 4, 8, "inference", "L40S 8-GPU"),
        ),
    ),
    SiteSpec(
        "iad-2",
        "us-east",
        -5,
        480,
        (
            NodeGroup("iad2-h200", H200, 12, 8, "training", "HGX H200"),
            NodeGroup("iad2-a100", A100, 8, 8, "inference", "DGX A100"),
        ),
    ),
    SiteSpec("sin-1", "ap-southeast", 8, 160, (NodeGroup("sin1-l40s", L40S, 8, 8, "inference", "L40S 8-GPU"),)),
)


DEFAULT_SEED = 7


# One rack that runs hot, so the demo shows the power detectors: the first four H100 nodes of ams-1
# (rack r01, as the simulate command racks nodes four by four) run a lighter job (HOT_RACK_COOL_UTIL %)
# and, for the first HOT_MINUTES of every HOT_PERIOD_MINUTES, run flat out near board power: about
# 30 kW against the HOT_RACK_BUDGET_KW budget the simulate command gives that rack (about 86 % of it
# otherwise). Driven by the clock, so it is the same on every run.
HOT_RACK_SITE = "ams-1"
HOT_RACK_GROUP = "ams1-h100"
HOT_RACK_NODES = 4
HOT_RACK_NAME = "r01"
HOT_RACK_BUDGET_KW = 28
HOT_RACK_COOL_UTIL = 75.0
HOT_PERIOD_MINUTES = 30
HOT_MINUTES = 12


def rack_runs_hot(now: datetime) -> bool:
    """Whether the hot rack is in its hot phase at ``now``."""
    return now.minute % HOT_PERIOD_MINUTES < HOT_MINUTES


# The sampler's figures, shared with the history rows (FleetSimulator.history_row) so that a
# backfilled hour reads as the live minutes do.
TRAINING_UTIL = (97.0, 2.5)  # a computing training GPU: normal(mean, sd), at most 100 %
TRAINING_DIP = (0.02, 5.0, 30.0)  # and now and then a checkpoint or data-loader dip: p, uniform(lo, hi)
POWER_SHARE = (0.85, 0.98)  # of the load's share of (board power - idle), uniform
HOT_POWER = (0.975, 0.995)  # x board power, flat out at the cap
# What drives a GPU over a stretch of history: its own workload ("work": a training job computing,
# or the inference daily curve), a hung job's collective spinning ("hung"), nothing ("idle": no
# job, starting up, failed, preempted) or a fault: fallen off the bus ("xid79"), double-bit ECC
# errors ("dbe": it works on, its errors counted) or thermal throttling ("thermal").
HISTORY_PARTS = ("work", "hung", "idle", "xid79", "dbe", "thermal")


def _mean_training_util() -> float:
    mean, sd = TRAINING_UTIL
    # E[min(X, 100)] for X ~ N(mean, sd): the mean less the part above 100.
    z = (100 - mean) / sd
    above = sd * (math.exp(-z * z / 2) / math.sqrt(2 * math.pi)) - (100 - mean) * 0.5 * math.erfc(z / math.sqrt(2))
    p, lo, hi = TRAINING_DIP
    return (1 - p) * (mean - above) + p * (lo + hi) / 2


_TRAINING_MEAN = _mean_training_util()


@dataclass
class SimGpu:
    uuid: str
    hostname: str
    index: int
    model: GpuModel
    workload: str
    utc_offset_h: int
    energy_mj: float = 0.0
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    remapped_unc: int = 0
    remapped_cor: int = 0
    pcie_replay: int = 0
    temp: float = 35.0
    fault: str | None = None
    fault_ticks_left: int = 0
    phase: float = field(default_factory=random.random)
    hot_rack: bool = False  # on the rack that runs hot (HOT_RACK_*)


def _gpu_uuid(rng: random.Random) -> str:
    return "GPU-" + str(uuid.UUID(int=rng.getrandbits(128), version=4))


def build_fleet(sites: tuple[SiteSpec, ...], *, gpu_limit: int | None, seed: int) -> dict[str, list[SimGpu]]:
    """The simulated GPUs per site, stable for a given seed (so a restarted demo reuses its GPUs)."""
    rng = random.Random(seed)
    fleet: dict[str, list[SimGpu]] = {}
    count = 0
    for site in sites:
        gpus: list[SimGpu] = []
        for group in site.groups:
            for n in range(group.nodes):
                # Another seed is another fleet: its own hosts, never two GPUs in one slot.
                hostname = (
                    f"{group.prefix}-{n + 1:03d}" if seed == DEFAULT_SEED else f"s{seed}-{group.prefix}-{n + 1:03d}"
                )
                for i in range(group.gpus_per_node):
                    if gpu_limit is not None and count >= gpu_limit:
                        break
                    gpus.append(
                        SimGpu(
                            _gpu_uuid(rng),
                            hostname,
                            i,
                            group.model,
                            group.workload,
                            site.utc_offset_h,
                            energy_mj=rng.uniform(1e9, 5e11),
                            phase=rng.random(),
                            hot_rack=site.name == HOT_RACK_SITE
                            and group.prefix == HOT_RACK_GROUP
                            and n < HOT_RACK_NODES,
                        )
                    )
                    count += 1
        fleet[site.name] = gpus
    return fleet


class FleetSimulator:
    def __init__(
        self, fleet: dict[str, list[SimGpu]], *, fault_rate_per_gpu_hour: float, interval: float, seed: int
    ) -> None:
        self.fleet = fleet
        self.interval = interval
        self.rng = random.Random(seed + 1)
        # Probability that a healthy GPU starts a fault on one tick.
        self.fault_p = fault_rate_per_gpu_hour * interval / 3600
        self.events: list[str] = []
        # Per-GPU overrides a workload simulator sets (fleet.training.simulator): by GPU UUID,
        # "gpu_util" (%) and "sm_active" (0-1) to report instead of the workload's own figures,
        # so a hung job's GPUs spin at 100 % and a starved one's idle.
        self.overrides: dict[str, dict[str, float]] = {}

    def _maybe_fault(self, gpu: SimGpu) -> None:
        if gpu.fault is not None:
            gpu.fault_ticks_left -= 1
            if gpu.fault_ticks_left <= 0:
                self.events.append(f"{gpu.hostname}/gpu{gpu.index}: {gpu.fault} cleared")
                if gpu.fault == "dbe":
                    # Repaired by a GPU reset, which zeroes the volatile ECC counts (the remapped
                    # rows stay: they are the GPU's for life).
                    gpu.ecc_dbe = 0
                    gpu.ecc_sbe = 0
                gpu.fault = None
            return
        if self.rng.random() >= self.fault_p:
            return
        kind = self.rng.choices(["xid79", "dbe", "thermal"], weights=[1, 1, 2])[0]
        gpu.fault = kind
        gpu.fault_ticks_left = int(self.rng.uniform(60, 240) / self.interval) + 1
        if kind == "dbe":
            gpu.ecc_dbe += 1
            gpu.remapped_unc += 1
        self.events.append(f"{gpu.hostname}/gpu{gpu.index}: {kind}")

    def sample(self, gpu: SimGpu, now: datetime) -> dict[str, Any]:
        m, rng = gpu.model, self.rng
        self._maybe_fault(gpu)
        if gpu.workload == "training":
            util = min(100.0, rng.gauss(*TRAINING_UTIL))
            if rng.random() < TRAINING_DIP[0]:  # a checkpoint or data-loader stall
                util = rng.uniform(*TRAINING_DIP[1:])
        else:
            util = max(0.0, min(100.0, 100 * self._diurnal(gpu, now) + rng.gauss(0, 6)))
        override = self.overrides.get(gpu.uuid, {})
        if "gpu_util" in override:
            util = max(0.0, min(100.0, override["gpu_util"] + rng.gauss(0, 1.5)))
        hot = gpu.hot_rack and "gpu_util" not in override  # a workload simulator's override comes first
        if hot:
            util = 100.0 if rack_runs_hot(now) else min(util, HOT_RACK_COOL_UTIL + rng.gauss(0, 2))
        load = util / 100
        power = m.idle_w + (m.tdp_w - m.idle_w) * load * rng.uniform(*POWER_SHARE)
        if hot and rack_runs_hot(now):
            power = m.tdp_w * rng.uniform(*HOT_POWER)  # flat out: at the power cap
        target_temp = 32 + 48 * load + rng.gauss(0, 1)
        sm_clock = m.sm_clock_max * (0.95 if load > 0.2 else 0.5)
        reasons = 0
        xid = 0
        if gpu.fault == "thermal":
            target_temp = m.slowdown_temp + rng.uniform(1, 4)
            sm_clock = m.sm_clock_max * rng.uniform(0.45, 0.6)
            power *= 0.8
            reasons = REASON_HW_THERMAL | REASON_HW_SLOWDOWN
        elif load > 0.95 and power > m.tdp_w * 0.97:
            reasons = REASON_SW_POWER_CAP
        if gpu.fault == "xid79":
            xid = 79
            util, power, sm_clock = 0.0, m.idle_w * 0.6, 0.0
        gpu.temp += (target_temp - gpu.temp) * 0.3
        gpu.energy_mj += power * self.interval * 1000
        if rng.random() < 0.001:
            gpu.ecc_sbe += 1
        fb_used = m.hbm_mib * (0.92 if gpu.workload == "training" else 0.35 + 0.5 * load)
        return {
            "gpu_uuid": gpu.uuid,
            "hostname": gpu.hostname,
            "gpu_index": gpu.index,
            "model": m.name,
            "ts": now.isoformat(),
            "gpu_util": round(util, 1),
            "mem_copy_util": round(util * 0.6, 1),
            "fb_used_mib": round(fb_used),
            "fb_free_mib": round(m.hbm_mib - fb_used),
            "gpu_temp_c": round(gpu.temp, 1),
            "memory_temp_c": round(gpu.temp + 6, 1),
            "power_w": round(power, 1),
            "sm_clock_mhz": round(sm_clock),
            "mem_clock_mhz": m.mem_clock,
            "energy_mj": int(gpu.energy_mj),
            "xid": xid,
            "ecc_sbe_total": gpu.ecc_sbe,
            "ecc_dbe_total": gpu.ecc_dbe,
            "remapped_rows_uncorrectable": gpu.remapped_unc,
            "remapped_rows_correctable": gpu.remapped_cor,
            "row_remap_failure": 0,
            "pcie_replay_total": gpu.pcie_replay,
            "throttle_reasons": reasons,
            "tensor_active": round(load * rng.uniform(0.3, 0.6), 3)
            if gpu.workload == "training"
            else round(load * 0.2, 3),
            "sm_active": round(
                max(0.0, min(1.0, override["sm_active"] + rng.gauss(0, 0.02)))
                if "sm_active" in override
                else load * 0.9,
                3,
            ),
        }

    def batches(self, now: datetime) -> dict[str, list[dict[str, Any]]]:
        return {site: [self.sample(g, now) for g in gpus] for site, gpus in self.fleet.items()}

    def daily_load(self, utc_offset_h: int, at: datetime) -> float:
        """The inference load's share of its peak at ``at`` in a site ``utc_offset_h`` from UTC."""
        local_hour = (at.hour + at.minute / 60 + utc_offset_h) % 24
        return 0.5 + 0.45 * math.sin(2 * math.pi * (local_hour - 9) / 24)

    def _diurnal(self, gpu: SimGpu, now: datetime) -> float:
        # Peak in the local afternoon (about 15:00), trough before dawn.
        return self.daily_load(gpu.utc_offset_h, now)

    @staticmethod
    def hot_share(start: datetime, seconds: float) -> float:
        """The share of [start, start + seconds) (whole minutes) in the hot rack's hot phase."""
        minutes = max(1, round(seconds / 60))
        first = start.minute
        return sum(1 for k in range(minutes) if (first + k) % HOT_PERIOD_MINUTES < HOT_MINUTES) / minutes

    def history_row(
        self, gpu: SimGpu, seconds: float, parts: list[tuple[str, float]], *, load: float, hot_share: float
    ) -> tuple:
        """A rollup row (fleet.telemetry.rollups.GPU_COLUMNS, in order) for ``gpu`` over ``seconds``,
        as the sampler's samples every ``interval`` would roll up: the means of ``sample``'s figures
        for what drove the GPU (``parts``: (HISTORY_PARTS kind, seconds), summing to ``seconds``),
        with a little noise. ``load`` is the inference load's share of its peak then (daily_load),
        ``hot_share`` the share of the time the hot rack runs hot (hot_share). A history's minutes
        and hours (fleet.management.backfill) are these rows."""
        m, rng = gpu.model, self.rng
        span = m.tdp_w - m.idle_w
        share = sum(POWER_SHARE) / 2
        interval = self.interval
        if len(parts) == 1 and parts[0][0] == "work" and not (gpu.hot_rack and hot_share):
            # Most rows: the GPU's own workload only.
            if gpu.workload == "training":
                util = _TRAINING_MEAN + rng.gauss(0, 0.4)
            else:
                util = max(0.0, min(100.0, 100 * load + rng.gauss(0, 1.5)))
            power = (m.idle_w + span * util / 100 * share) * (1 + rng.gauss(0, 0.003))
            temp = 32 + 48 * util / 100 + rng.gauss(0, 0.3)
            return (
                max(1, round(seconds / interval)),
                util,
                min(100.0, util + 4.0),
                temp,
                temp + 1.5,
                power,
                min(m.tdp_w, power * 1.03),
                power * seconds,
                0,
                0,
                0,
            )
        # (seconds, util %, power W, temperature C, throttled, an error sample)
        pieces: list[tuple[float, float, float, float, bool, bool]] = []

        def piece(secs: float, util: float, power: float, *, temp: float | None = None, **flags: bool) -> None:
            temp = 32 + 48 * util / 100 if temp is None else temp
            pieces.append((secs, util, power, temp, flags.get("capped", False), flags.get("error", False)))

        for kind, secs in parts:
            if secs <= 0:
                continue
            if kind == "xid79":
                piece(secs, 0.0, m.idle_w * 0.6, error=True)
            elif kind == "hung":
                piece(secs, 100.0, m.idle_w + span * share)
            elif kind == "idle":
                piece(secs, 0.6, m.idle_w + span * 0.006 * share)
            elif gpu.workload != "training":
                util = max(0.0, min(100.0, 100 * load + rng.gauss(0, 1.5)))
                power = m.idle_w + span * util / 100 * share
                if kind == "thermal":
                    piece(secs, util, power * 0.8, temp=m.slowdown_temp + 2.5, capped=True)
                else:
                    piece(secs, util, power, error=kind == "dbe")
            else:
                util = _TRAINING_MEAN + rng.gauss(0, 0.4)
                hot_s = secs * hot_share if gpu.hot_rack and kind == "work" else 0.0
                if hot_s:
                    piece(hot_s, 100.0, m.tdp_w * sum(HOT_POWER) / 2, capped=True)
                    util = min(util, HOT_RACK_COOL_UTIL)
                power = m.idle_w + span * util / 100 * share
                if kind == "thermal":
                    piece(secs - hot_s, util, power * 0.8, temp=m.slowdown_temp + 2.5, capped=True)
                elif secs - hot_s > 0:
                    piece(secs - hot_s, util, power, error=kind == "dbe")
        total = sum(p[0] for p in pieces) or 1.0
        util_mean = sum(p[0] * p[1] for p in pieces) / total
        power_mean = sum(p[0] * p[2] for p in pieces) / total * (1 + rng.gauss(0, 0.003))
        temp_mean = sum(p[0] * p[3] for p in pieces) / total + rng.gauss(0, 0.3)
        busiest = max((p[1] for p in pieces), default=0.0)
        return (
            max(1, round(seconds / interval)),
            util_mean,
            min(100.0, busiest + (4.0 if busiest < 100 else 0.0)),
            temp_mean,
            max((p[3] for p in pieces), default=32.0) + 1.5,
            power_mean,
            min(m.tdp_w, max((p[2] for p in pieces), default=m.idle_w) * 1.03),
            power_mean * seconds,
            79 if any(k == "xid79" for k, _ in parts) else 0,
            round(sum(p[0] for p in pieces if p[5]) / interval),
            round(sum(p[0] for p in pieces if p[4]) / interval),
        )


class Poster:
    """Posts batches like a real agent: token auth, idempotency key, capped exponential backoff on
    5xx and 429 (honouring Retry-After), and no retry on other 4xx."""

    def __init__(
        self,
        base_url: str,
        tokens: dict[str, str],
        *,
        max_attempts: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/api/v1/ingest/gpu-samples"
        self.tokens = tokens
        self.session = requests.Session()
        self.max_attempts = max_attempts
        self.sleep = sleep

    def post(self, site: str, samples: list[dict[str, Any]]) -> requests.Response | None:
        return self.send(site, self.url, {"samples": samples})

    def send(self, site: str, url: str, body: dict[str, Any]) -> requests.Response | None:
        """POST ``body`` as JSON to ``url`` (absolute, or a path under the base URL) with the
        site's token; the response, or None when every attempt failed."""
        return self._post(site, url, {"json": body})

    def send_text(self, site: str, url: str, text: str) -> requests.Response | None:
        """POST a Prometheus text exposition to ``url`` as ``send`` posts JSON."""
        return self._post(site, url, {"data": text.encode(), "content_type": "text/plain; version=0.0.4"})

    def _post(self, site: str, url: str, payload: dict[str, Any]) -> requests.Response | None:
        if url.startswith("/"):
            url = self.base_url + url
        headers = {"Authorization": f"Bearer {self.tokens[site]}", "Idempotency-Key": str(uuid.uuid4())}
        content_type = payload.pop("content_type", None)
        if content_type:
            headers["Content-Type"] = content_type
        for attempt in range(self.max_attempts):
            try:
                response = self.session.post(url, headers=headers, timeout=10, **payload)
            except requests.RequestException:
                response = None
            if response is not None and response.status_code < 500 and response.status_code != 429:
                return response
            retry_after = response.headers.get("Retry-After") if response is not None else None
            delay = min(5.0, 0.25 * 2**attempt)
            if retry_after and retry_after.isdigit():
                delay = min(5.0, float(retry_after))
            self.sleep(delay)
        return None


def utcnow() -> datetime:
    return datetime.now(UTC)
