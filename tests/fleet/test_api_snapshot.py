"""Characterisation ("golden") test: the API's answers for one fixed, seeded fleet, compared whole
with the JSON stored under tests/fleet/snapshots/.

It pins what the console computes today, to the last figure, so a change meant to alter nothing
(moving fleet's modules into sub-packages, say) is shown to alter nothing. The goldens:

* serving-slo-llama-70b-chat, serving-slo-bert-large: ``/api/v1/serving/endpoints/<id>/slo`` of a
  two-engine vLLM endpoint (a restart, a slow spell, SLOs set by an SRE: interpolated TTFT, burn
  alerts firing) and of a Triton model (failures: availability under 1);
* serving-overview, serving-endpoint-llama-70b-chat-7d: the serving pages' snapshots (per-minute
  and per-hour points, gauges, change events and evals);
* training-job-snapshot, training-overview-24h: a running job with checkpoints, a data stall, a
  failure and a restore (account, losses, advisor, step and GPU series); the goodput overview with
  a second job (preempted, completed);
* fleet-overview-15m, -1h, -7d: the fleet page from raw samples, minute rollups and hour rollups
  (stale GPUs, XID and ECC errors, throttling, a dcgm-exporter push);
* capacity-plan, capacity-approvals: nine months of supply (racks, a power contract, orders, a
  late and a slipped order, a grid approval) against reservations in three tiers, and what each
  approval answered (200, or 409 for over-commit and quota).

How it stays deterministic:

* one fixed instant, NOW, is "the time" for the whole test: ``django.utils.timezone.now`` returns
  it (every read and every ingest check asks that function), and every sample, event and
  reservation is dated relative to it. NOW is far in the future on purpose: the hour rollups only
  take hours dirtied (at the database's real clock) a minute before "now", so the real clock must
  stay behind NOW;
* everything is seeded through the public doors (the JSON and Prometheus ingest doors with agent
  tokens, the training, serving, fleet and capacity APIs as an Operator or an Admin) and read back
  as a Viewer; the periodic work the beat would do (rollups, goodput accounts, reservation states)
  runs by its beat schedule entry, so the test names no task module;
* only what legitimately differs between runs is normalised: database ids (each becomes the name
  of what it identifies, in fields and in page links). Floats are compared to 1e-9 relative, to
  allow for PostgreSQL summing in another order; anything more is a change.

Nothing under fleet/ is imported but ``fleet.models``: the file runs unchanged whatever fleet's
other modules are called.

A difference is a change in what the API answers. If it is meant, rewrite the goldens with
GOODPUT_WRITE_SNAPSHOTS=1 and review their diff with the change; if not, it is a regression.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.celery import app as celery_app
from fleet.models import Site, Team

pytestmark = pytest.mark.django_db

# Mid-minute and mid-hour, so every floor and window edge is exercised.
NOW = datetime(2099, 6, 17, 14, 37, 20, tzinfo=UTC)
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WRITE = os.environ.get("GOODPUT_WRITE_SNAPSHOTS") == "1"
REL_TOL = 1e-9

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
VLLM_ENDPOINT = "llama-70b-chat"


# --- the clock ---------------------------------------------------------------------------------


class Clock:
    """What ``timezone.now()`` answers while the test runs."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fixed = Clock(NOW)
    monkeypatch.setattr(timezone, "now", fixed)
    return fixed


def ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


def iso(ts: datetime) -> str:
    return ts.isoformat()


def month(k: int) -> date:
    """The first day of the k-th month after NOW's."""
    y, m = divmod(NOW.month - 1 + k, 12)
    return date(NOW.year + y, m + 1, 1)


def midnight(day: date) -> str:
    return datetime(day.year, day.month, day.day, tzinfo=UTC).isoformat()


# --- people and doors --------------------------------------------------------------------------


class World:
    """The clients the test seeds and reads with, and the agent tokens of the two sites."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)
        self.ids: dict[str, dict[int, str]] = defaultdict(dict)  # kind -> pk -> name

    def name(self, kind: str, pk: int, name: str) -> None:
        self.ids[kind][pk] = name


def _login(user: User) -> Client:
    client = Client()
    client.force_login(user)  # after the clock is set: the session expires relative to NOW
    return client


@pytest.fixture
def world(
    clock: Clock,
    site_a: Site,
    site_b: Site,
    token_a: str,
    token_b: str,
    admin_user: User,
    operator_user: User,
    viewer_user: User,
) -> World:
    w = World(
        clock=clock,
        site_a=site_a,
        site_b=site_b,
        token_a=token_a,
        token_b=token_b,
        admin=_login(admin_user),
        operator=_login(operator_user),
        viewer=_login(viewer_user),
        agent=Client(),
    )
    w.name("site", site_a.pk, site_a.name)
    w.name("site", site_b.pk, site_b.name)
    return w


def ok(response: Any, *codes: int) -> Any:
    assert response.status_code in (codes or (200, 201, 202)), (response.status_code, response.content[:2000])
    return response.json() if response.content else None


def send_json(client: Client, method: str, url: str, body: Any, token: str | None = None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return getattr(client, method)(url, json.dumps(body), content_type="application/json", **headers)


def run_beat(*entries: str, times: int = 3) -> None:
    """Run beat schedule entries as the beat would (eagerly, in this process), by their schedule
    name: whatever module the task lives in, the schedule names it."""
    celery_app.loader.import_default_modules()
    for entry in entries:
        name = settings.CELERY_BEAT_SCHEDULE[entry]["task"]
        assert name in celery_app.tasks, f"beat entry {entry}: task {name} is not registered"
        for _ in range(times):  # every pass is idempotent; the later ones find nothing left
            celery_app.tasks[name].apply(throw=True)


# --- GPU telemetry -----------------------------------------------------------------------------

# (site, hostname, GPUs, model): four H100 nodes at ams-1 (the first two run the training job), two
# A100 nodes at iad-2 (the second stopped reporting five minutes ago).
NODES = [
    ("a", "ams-n000", 8, H100),
    ("a", "ams-n001", 8, H100),
    ("a", "ams-n002", 8, H100),
    ("a", "ams-n003", 8, H100),
    ("b", "iad-n000", 8, A100),
    ("b", "iad-n001", 8, A100),
]
JOB_NODES = ("ams-n000", "ams-n001")
JOB_START = ago(hours=2, minutes=5)
FAILED_AT = ago(minutes=68, seconds=10)
RESTARTED_AT = ago(minutes=63)


def gpu_uuid(hostname: str, index: int) -> str:
    return f"GPU-{hostname}-{index:02d}-0000-4000-8000"


def _job_running(ts: datetime) -> bool:
    return JOB_START + timedelta(minutes=1) <= ts < FAILED_AT or ts >= RESTARTED_AT + timedelta(seconds=40)


def gpu_sample(node: int, hostname: str, index: int, model: str, ts: datetime) -> dict[str, Any]:
    """One GPU's reading: a deterministic function of the GPU and the time. Temperatures differ
    from GPU to GPU (the dashboard's "hottest" list has no ties)."""
    k = int((ts - ago(hours=3)).total_seconds()) // 20  # the sample's tick
    busy = hostname not in JOB_NODES or _job_running(ts)
    util = (88.0 + (index * 7 + k) % 11) if busy else (3.0 + index % 3)
    if hostname == "ams-n002":
        util = 41.0 + (index * 5 + k) % 17
    sample: dict[str, Any] = {
        "gpu_uuid": gpu_uuid(hostname, index),
        "hostname": hostname,
        "gpu_index": index,
        "model": model,
        "ts": iso(ts),
        "gpu_util": util,
        "fb_used_mib": 40000 + 997 * index + (k % 13) * 50,
        "fb_free_mib": 81920 - (40000 + 997 * index + (k % 13) * 50),
        "gpu_temp_c": round(48.0 + node * 4.1 + index * 0.37 + (k % 5) * 0.2, 2),
        "memory_temp_c": round(55.0 + node * 3.0 + index * 0.5, 2),
        "power_w": round((650.0 if model == H100 else 380.0) * util / 100 + 70.0 + index, 3),
        "sm_clock_mhz": 1980 if util > 50 else 1410,
        "mem_clock_mhz": 2619,
        "energy_mj": 900_000_000_000 + node * 10_000_000 + index * 1_000_000 + k * 12_000,
        "xid": 0,
        "ecc_sbe_total": index,
        "ecc_dbe_total": 0,
        "throttle_reasons": 0,
        "tensor_active": round(util / 250, 3),
    }
    if hostname == "ams-n003" and index == 5:
        sample["xid"] = 79 if ts >= ago(minutes=9) else 0  # fell off the bus nine minutes ago
    if hostname == "ams-n003" and index == 2:
        sample["ecc_dbe_total"] = 2
    if hostname == "iad-n000" and index in (1, 6):
        sample["throttle_reasons"] = 0x20 | 0x4  # SW thermal slowdown and power cap
    return sample


def seed_gpus(w: World) -> None:
    """Every GPU every 20 s over the last 16 minutes (iad-n001 stops 5 minutes ago); the job's
    GPUs also every 60 s from before the job started. Batches of a few minutes per site."""
    batches: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for n, (site, hostname, count, model) in enumerate(NODES):
        times: list[datetime] = []
        if hostname in JOB_NODES:
            t = JOB_START - timedelta(minutes=5)
            while t < ago(minutes=16):
                times.append(t)
                t += timedelta(seconds=60)
        t = ago(minutes=16)
        stop = ago(minutes=5) if hostname == "iad-n001" else NOW
        while t < stop:
            times.append(t)
            t += timedelta(seconds=20)
        for ts in times:
            chunk = int((ts - ago(hours=3)).total_seconds()) // 600
            for index in range(count):
                batches[(site, chunk)].append(gpu_sample(n, hostname, index, model, ts))
    for (site, _), samples in sorted(batches.items()):
        token = w.token_a if site == "a" else w.token_b
        ok(send_json(w.agent, "post", "/api/v1/ingest/gpu-samples", {"samples": samples}, token), 202)


def seed_dcgm(w: World) -> None:
    """The dcgm-exporter fixture (node gpu-a-001, two H100s) pushed through the Prometheus door
    twice, a minute apart, with the receive time as the samples' time."""
    body = (FIXTURES / "dcgm-exporter.prom").read_text()
    for seconds in (75, 15):
        w.clock.now = NOW - timedelta(seconds=seconds)
        ok(push_prometheus(w.agent, w.token_a, body), 202)
    w.clock.now = NOW


def push_prometheus(client: Client, token: str, body: str, query: str = "") -> Any:
    return client.post(
        f"/api/v1/ingest/prometheus{query}",
        data=body,
        content_type="text/plain; version=0.0.4",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


# --- serving: scrapes made from the repository's vLLM and Triton fixtures ----------------------

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)$")
_LE = re.compile(r',?le="([^"]*)"')


class Exposition:
    """A fixture's samples, with each histogram's buckets in order, to write later scrapes of the
    same server: counters and histograms scaled by the traffic served since it started, a share of
    the latency observations moved ``SHIFT`` buckets up (a slow spell), gauges set per scrape."""

    SHIFT = 2

    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.samples: list[tuple[str, str, float]] = []  # (name, labels text, value)
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split(maxsplit=3)
                self.types[family] = kind
            if not line.strip() or line.startswith("#"):
                continue
            match = _SAMPLE.match(line)
            assert match, line
            self.samples.append((match["name"], match["labels"] or "", float(match["value"])))
        # The buckets of each histogram series, by le: cumulative counts in le order.
        self.buckets: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for name, labels, value in self.samples:
            if name.endswith("_bucket"):
                le = _LE.search(labels)
                assert le, labels
                self.buckets[name + _LE.sub("", labels)].append((_le(le[1]), value))
        for series in self.buckets.values():
            series.sort()

    def family(self, name: str) -> tuple[str, str]:
        """(family, kind) of a sample name."""
        for suffix in ("_bucket", "_sum", "_count"):
            base = name.removesuffix(suffix)
            if base != name and self.types.get(base) == "histogram":
                return base, "histogram"
        return name, self.types.get(name, "untyped")

    def scrape(
        self,
        ts: datetime,
        *,
        units: float,
        slow: float = 0.0,
        gauges: Callable[[str, str, float], float] | None = None,
        extra: Callable[[str, str], float] | None = None,
        second_engine: float = 0.0,
    ) -> str:
        """The exposition at ``ts``: ``units`` hundredths of the fixture's traffic served normally
        and ``slow`` more served slowly (latency histograms only), every sample timestamped. With
        ``second_engine``, each ``engine="0"`` series has an ``engine="1"`` twin that served that
        share of engine 0's traffic (its gauges from ``gauges`` too)."""
        ms = int(ts.timestamp() * 1000)
        lines = []
        for name, labels, value in self.samples:
            family, kind = self.family(name)
            latency = kind == "histogram" and ("seconds" in family or "_ms" in family)
            if kind == "gauge":
                out = gauges(name, labels, value) if gauges else value
            elif name.endswith("_bucket") and latency and slow:
                le = _le(_LE.search(labels)[1])  # type: ignore[index]
                series = self.buckets[name + _LE.sub("", labels)]
                j = next(i for i, (bound, _) in enumerate(series) if bound == le)
                total = series[-1][1]
                shifted = total if le == math.inf else (series[j - self.SHIFT][1] if j >= self.SHIFT else 0.0)
                out = (value * units + shifted * slow) / 100
            elif name.endswith("_sum") and latency:
                out = value * (units + 3 * slow) / 100
            else:
                out = value * (units + slow) / 100
            if extra is not None:
                out += extra(name, labels)
            lines.append(f"{name}{labels} {round(out, 3)!r} {ms}")
            if second_engine and 'engine="0"' in labels:
                twin = labels.replace('engine="0"', 'engine="1"')
                out = gauges(name, twin, value) if kind == "gauge" and gauges else out * second_engine
                lines.append(f"{name}{twin} {round(out, 3)!r} {ms}")
        return "\n".join(lines) + "\n"


def _le(text: str) -> float:
    return math.inf if text == "+Inf" else float(text)


SERVER_1 = ago(days=5)  # the vLLM server's first start
SERVER_2 = ago(hours=3, minutes=2)  # ... and its restart
SLOW_FROM = ago(minutes=42)
TRITON_START = ago(hours=2, minutes=12)


def _vllm_gauges(k: int) -> Callable[[str, str, float], float]:
    def gauge(name: str, labels: str, value: float) -> float:
        e = 1 if 'engine="1"' in labels else 0
        if "running" in name:
            return float(30 + (k * 7 + e * 5) % 23)
        if "waiting" in name:
            return float((k * 3 + e) % 9)
        return round(0.55 + ((k * 11 + e * 17) % 40) / 100, 4)  # KV-cache usage

    return gauge


def vllm_times() -> list[datetime]:
    """Scrapes every 5 minutes of a server with two engines: a burst four days ago, one twenty
    hours ago, and the last five hours (the server restarts three hours ago; its latency degrades
    over the last 42 minutes)."""
    times = []
    for start, count in ((ago(days=4, hours=2, minutes=1, seconds=40), 4), (ago(hours=20, seconds=40), 4)):
        times += [start + timedelta(minutes=5 * i) for i in range(count)]
    t = ago(hours=5, seconds=40)
    while t <= NOW:
        times.append(t)
        t += timedelta(minutes=5)
    return times


def seed_serving(w: World) -> dict[str, int]:
    vllm = Exposition((FIXTURES / "vllm.prom").read_text())
    for k, ts in enumerate(vllm_times()):
        started = SERVER_2 if ts >= SERVER_2 else SERVER_1
        units = (ts - started) / timedelta(minutes=5)
        slow = max(0.0, (ts - SLOW_FROM) / timedelta(minutes=10))
        body = vllm.scrape(ts, units=units, slow=slow, gauges=_vllm_gauges(k), second_engine=0.5)
        ok(push_prometheus(w.agent, w.token_a, body, f"?endpoint={VLLM_ENDPOINT}&kind=vllm"), 202)

    triton = Exposition((FIXTURES / "triton.prom").read_text())
    t, k = TRITON_START + timedelta(seconds=25), 0
    while t <= NOW:
        units = (t - TRITON_START) / timedelta(minutes=5)
        # Backend failures of bert_large 3 over the last 15 minutes, on top of its usual ones.
        burst = max(0.0, (t - ago(minutes=15)) / timedelta(minutes=5)) * 60

        def extra(name: str, labels: str, burst: float = burst) -> float:
            if name == "nv_inference_request_failure" and 'reason="BACKEND"' in labels and 'version="3"' in labels:
                return burst
            return 0.0

        def gauges(name: str, labels: str, value: float, k: int = k) -> float:
            return float((k * 5 + len(labels)) % 13)

        body = triton.scrape(t, units=units, gauges=gauges, extra=extra)
        ok(push_prometheus(w.agent, w.token_b, body, "?kind=triton"), 202)
        t, k = t + timedelta(minutes=5), k + 1

    ids = {}
    for site, name in (("ams-1", VLLM_ENDPOINT), ("iad-2", "bert_large"), ("iad-2", "resnet50")):
        found = ok(w.viewer.get("/api/v1/fleet/endpoints/", {"site": site, "name": name}))["results"]
        assert len(found) == 1, found
        ids[name] = found[0]["id"]
        w.name("endpoint", found[0]["id"], name)
    # SLOs an SRE set: an 800 ms TTFT threshold falls between the vLLM buckets (interpolated).
    ok(
        send_json(
            w.operator,
            "patch",
            f"/api/v1/fleet/endpoints/{ids[VLLM_ENDPOINT]}/",
            {"ttft_threshold_ms": 800, "ttft_target_pct": 95.0, "itl_threshold_ms": 40, "slo_window_days": 28},
        )
    )
    ok(
        send_json(
            w.operator, "patch", f"/api/v1/fleet/endpoints/{ids['bert_large']}/", {"availability_target_pct": 99.5}
        )
    )
    # What changed on the vLLM endpoint (chart markers) and how it scored.
    changes = [
        {
            "id": "chg-1",
            "ts": iso(SLOW_FROM - timedelta(minutes=1)),
            "kind": "quantisation",
            "from_value": "bf16",
            "to_value": "fp8",
            "model_version": "v3.1",
            "note": "fp8 KV cache",
        },
        {
            "id": "chg-2",
            "ts": iso(ago(hours=2, minutes=30)),
            "kind": "scale_out",
            "from_value": "2",
            "to_value": "3",
            "ready_at": iso(ago(hours=2, minutes=26, seconds=15)),
        },
    ]
    ok(
        send_json(w.operator, "post", f"/api/v1/serving/endpoints/{ids[VLLM_ENDPOINT]}/changes", {"items": changes}),
        201,
    )
    evals = [
        {
            "id": "ev-1",
            "ts": iso(ago(hours=3, minutes=30)),
            "suite": "mmlu",
            "metric": "accuracy",
            "score": 0.823,
            "model_version": "v3",
        },
        {
            "id": "ev-2",
            "ts": iso(ago(minutes=30)),
            "suite": "mmlu",
            "metric": "accuracy",
            "score": 0.801,
            "model_version": "v3.1",
        },
    ]
    ok(
        send_json(
            w.agent, "post", f"/api/v1/serving/endpoints/{ids[VLLM_ENDPOINT]}/evals", {"items": evals}, w.token_a
        ),
        201,
    )
    return ids


# --- training ---------------------------------------------------------------------------------


def _step(n: int, ts: datetime, *, every: float = 30.0, data_wait: bool = False) -> dict[str, Any]:
    event = {
        "id": f"{'w' if every == 30.0 else 'b'}-step-{n}-{int((ts - NOW).total_seconds())}",
        "ts": iso(ts),
        "kind": "step",
        "step": n,
        "step_time_s": round(every - 0.4 + (n % 7) * 0.05, 2),
        "tokens": 4_194_304,
    }
    if data_wait:
        event["data_wait_s"] = 6.5  # a slow data loader
    return event


def _ckpt(step: int, ts: datetime, duration: float, gib: int, prefix: str = "ckpt") -> dict[str, Any]:
    return {
        "id": f"{prefix}-{step}",
        "ts": iso(ts),
        "kind": "checkpoint_saved",
        "step": step,
        "duration_s": duration,
        "bytes": gib * 2**30,
    }


def _run(
    events: list[dict[str, Any]],
    step: int,
    t: datetime,
    until: datetime,
    *,
    every: float,
    ckpt_every: int,
    ckpt_s: float,
    gib: int,
    stall_from: int = 0,
    prefix: str = "ckpt",
) -> tuple[int, datetime]:
    """Steps from ``step`` at ``t`` every ``every`` seconds until ``until``, a checkpoint after each
    ``ckpt_every`` steps (the steps pause while it saves); returns the next step and time."""
    while t < until:
        events.append(_step(step, t, every=every, data_wait=bool(stall_from) and step >= stall_from and step % 4 == 0))
        if step % ckpt_every == 0 and t + timedelta(seconds=ckpt_s + 2) < until:
            events.append(_ckpt(step, t + timedelta(seconds=ckpt_s + 2), ckpt_s, gib, prefix))
            t += timedelta(seconds=ckpt_s + 2)
        step += 1
        t += timedelta(seconds=every)
    return step, t


def llama_events() -> list[dict[str, Any]]:
    """Allocated, started, steps every 30 s with a checkpoint every 40 steps, a data-loader stall,
    an NCCL failure 68 minutes ago, a restart that restores the last checkpoint, steps since."""
    t0 = JOB_START
    events: list[dict[str, Any]] = [
        {"id": "alloc-1", "ts": iso(t0), "kind": "allocated", "node": "ams-n000"},
        {"id": "start-1", "ts": iso(t0 + timedelta(seconds=35)), "kind": "started", "node": "ams-n000"},
    ]
    step, _ = _run(
        events,
        1,
        t0 + timedelta(seconds=95),
        FAILED_AT - timedelta(seconds=20),
        every=30.0,
        ckpt_every=40,
        ckpt_s=48.5,
        gib=140,
        stall_from=60,
    )
    events.append(
        {
            "id": "fail-1",
            "ts": iso(FAILED_AT),
            "kind": "failed",
            "reason": "NCCL watchdog timeout: rank 11 (ams-n001) did not answer",
            "node": "ams-n001",
        }
    )
    last_ckpt = max(e["step"] for e in events if e["kind"] == "checkpoint_saved")
    assert step - 1 > last_ckpt  # the failure loses the steps since the checkpoint
    events += [
        {"id": "start-2", "ts": iso(RESTARTED_AT), "kind": "started", "node": "ams-n000"},
        {
            "id": "restore-2",
            "ts": iso(RESTARTED_AT + timedelta(seconds=40)),
            "kind": "restored",
            "step": last_ckpt,
            "duration_s": 38.0,
        },
    ]
    _run(
        events,
        last_ckpt + 1,
        RESTARTED_AT + timedelta(seconds=70),
        NOW - timedelta(seconds=20),
        every=30.0,
        ckpt_every=40,
        ckpt_s=51.0,
        gib=140,
    )
    return events


def bert_events() -> list[dict[str, Any]]:
    """A smaller job at iad-2: preempted, resumed, restored, completed, released."""
    t0 = ago(hours=9, minutes=30)
    events: list[dict[str, Any]] = [
        {"id": "b-alloc", "ts": iso(t0), "kind": "allocated"},
        {"id": "b-start", "ts": iso(t0 + timedelta(seconds=20)), "kind": "started"},
    ]
    step, t = _run(
        events,
        1,
        t0 + timedelta(seconds=80),
        t0 + timedelta(minutes=88),
        every=60.0,
        ckpt_every=60,
        ckpt_s=20.0,
        gib=30,
        prefix="b-ckpt",
    )
    events += [
        {"id": "b-preempt", "ts": iso(t), "kind": "preempted", "reason": "Preempted by a higher-priority workload"},
        {"id": "b-resume", "ts": iso(t + timedelta(minutes=7)), "kind": "resumed"},
        {"id": "b-start-2", "ts": iso(t + timedelta(minutes=7, seconds=25)), "kind": "started"},
        {"id": "b-restore", "ts": iso(t + timedelta(minutes=8)), "kind": "restored", "step": 60, "duration_s": 31.0},
    ]
    step, t = _run(
        events,
        61,
        t + timedelta(minutes=9),
        t + timedelta(minutes=99),
        every=60.0,
        ckpt_every=60,
        ckpt_s=20.0,
        gib=30,
        prefix="b-ckpt",
    )
    events += [
        {"id": "b-done", "ts": iso(t), "kind": "completed", "step": step - 1},
        {"id": "b-release", "ts": iso(t + timedelta(seconds=30)), "kind": "released"},
    ]
    return events


def seed_training(w: World) -> dict[str, int]:
    ids = {}
    jobs = [
        (
            w.token_a,
            {
                "name": "llama-70b-pretrain",
                "team": "foundation",
                "framework": "megatron",
                "gang_size": 16,
                "scheduler": "kueue",
                "scheduler_id": "default/llama-70b",
                "priority_tier": "reserved",
                "checkpoint_interval_s": 1200,
                "nodes": list(JOB_NODES),
                "gpus": [gpu_uuid(h, i) for h in JOB_NODES for i in range(8)],
            },
            llama_events(),
        ),
        (
            w.token_b,
            {
                "name": "bert-finetune",
                "team": "search",
                "framework": "huggingface",
                "gang_size": 8,
                "scheduler": "slurm",
                "scheduler_id": "48213",
                "priority_tier": "preemptible",
                "checkpoint_interval_s": 3600,
                "nodes": ["iad-n000"],
            },
            bert_events(),
        ),
    ]
    for token, body, events in jobs:
        job = ok(send_json(w.agent, "post", "/api/v1/training/jobs/", body, token), 201)
        ids[body["name"]] = job["id"]
        w.name("job", job["id"], body["name"])
        for i in range(0, len(events), 150):  # the client sends a batch at a time
            batch = events[i : i + 150]
            ok(send_json(w.agent, "post", f"/api/v1/training/jobs/{job['id']}/events", {"events": batch}, token), 200)
    return ids


# --- capacity ---------------------------------------------------------------------------------


def seed_capacity(w: World) -> list[dict[str, Any]]:
    """Racks and a smaller power contract (Admin), teams (an Admin adds them in the admin), pools,
    orders, a grid approval, quotas and reservations (Operator): some approved, some refused (409)
    when requested (over the team's quota, or a team without one) or when approved (over supply),
    one order that slips after the approvals counted on it. Returns what each request or approval
    answered."""
    for team in ("alpha", "beta", "gamma", "delta", "search"):
        Team.objects.create(name=team)
    ok(send_json(w.admin, "patch", f"/api/v1/fleet/sites/{w.site_a.pk}/", {"contracted_power_kw": "40.0"}))
    rack = ok(
        send_json(
            w.admin, "post", "/api/v1/fleet/racks/", {"site": "ams-1", "name": "ams-r1", "power_budget_kw": "20.0"}
        ),
        201,
    )
    w.name("rack", rack["id"], "ams-r1")
    for hostname in ("ams-n000", "ams-n001", "ams-n002"):
        ok(send_json(w.operator, "patch", f"/api/v1/fleet/nodes/{hostname}/", {"rack": rack["id"]}))

    pools = {}
    for site, model, name in (("ams-1", H100, "ams-h100"), ("iad-2", A100, "iad-a100")):
        pool = ok(
            send_json(w.operator, "post", "/api/v1/capacity/pools/", {"site": site, "gpu_model": model, "name": name}),
            201,
        )
        pools[name] = pool["id"]
        w.name("pool", pool["id"], name)
    h100, a100 = pools["ams-h100"], pools["iad-a100"]
    today = NOW.date()
    orders = [
        {
            "pool": h100,
            "count": 8,
            "ordered_on": str(today - timedelta(days=250)),
            "promised_on": str(month(2)),
            "vendor": "Supermicro",
            "reference": "PO-1001",
        },
        {
            "pool": h100,
            "count": 16,
            "ordered_on": str(today - timedelta(days=200)),
            "promised_on": str(month(4)),
            "vendor": "Dell",
            "reference": "PO-1002",
        },
        {
            "pool": h100,
            "count": 8,
            "ordered_on": str(today - timedelta(days=300)),
            "promised_on": str(today - timedelta(days=10)),
            "vendor": "Dell",
            "reference": "PO-0990",
        },  # late
        {
            "pool": a100,
            "count": 8,
            "ordered_on": str(today - timedelta(days=90)),
            "promised_on": str(month(1) + timedelta(days=9)),
            "vendor": "HPE",
            "reference": "PO-2001",
            "status": "shipped",
        },
    ]
    # Separation of duties: the Operator requests orders and power, the Admin approves them and
    # sets the quotas, and approves the Operator's reservations below.
    order_ids = [ok(send_json(w.operator, "post", "/api/v1/capacity/orders/", o), 201)["id"] for o in orders]
    for order_id in order_ids:
        ok(send_json(w.admin, "post", f"/api/v1/capacity/orders/{order_id}/approve/", {}))
    for site, kw, on, status in (("ams-1", "10", month(3), "approved"), ("ams-1", "500", month(1), "requested")):
        grid = ok(
            send_json(
                w.operator,
                "post",
                "/api/v1/capacity/approvals/",
                {"site": site, "added_kw": kw, "expected_on": str(on), "reference": f"GRID-{kw}"},
            ),
            201,
        )
        if status == "approved":
            ok(send_json(w.admin, "post", f"/api/v1/capacity/approvals/{grid['id']}/approve/", {}))
    quotas = (("alpha", h100, 16, 8), ("beta", h100, 12, 12), ("gamma", h100, 8, 0), ("search", a100, 8, 0))
    for team, pool, nominal, borrow in quotas:
        ok(
            send_json(
                w.admin,
                "post",
                "/api/v1/capacity/quotas/",
                {"team": team, "pool": pool, "nominal_gpus": nominal, "borrowing_limit_gpus": borrow},
            ),
            201,
        )

    m = lambda k, days=0: midnight(month(k) + timedelta(days=days))  # noqa: E731
    reservations = [
        ("alpha", h100, 4, midnight(today - timedelta(days=3)), m(2), "reserved"),  # holds GPUs now
        ("alpha", h100, 10, m(1), m(3), "reserved"),
        ("beta", h100, 6, m(1, 14), m(2), "on-demand"),
        ("beta", h100, 18, m(2), m(6), "reserved"),
        ("gamma", h100, 8, m(1), m(5), "preemptible"),
        ("alpha", h100, 20, m(4), m(5), "on-demand"),
        ("delta", h100, 99, m(1), m(7), "reserved"),  # more than the pool will ever have
        ("alpha", h100, 30, m(5), m(6), "reserved"),  # over alpha's quota
        ("search", a100, 6, midnight(today - timedelta(days=1)), m(3), "reserved"),
        ("search", a100, 12, m(2), m(4), "on-demand"),  # over search's quota (8, no borrowing)
    ]
    answers = []
    for i, (team, pool, gpus, start, end, tier) in enumerate(reservations):
        body = {
            "team": team,
            "pool": pool,
            "gpus": gpus,
            "start": start,
            "end": end,
            "tier": tier,
            "priority": 100 - i,
            "note": f"plan line {i}",
            "client_id": f"snap-{i}",
        }
        requested = send_json(w.operator, "post", "/api/v1/capacity/reservations/", body)
        if requested.status_code == 409:  # the team's quota refuses it when requested
            answers.append({"reservation": f"{team}-{i}", "status": 409, "body": requested.json()})
            continue
        r = ok(requested, 201)
        w.name("reservation", r["id"], f"{team}-{i}")
        response = w.admin.post(f"/api/v1/capacity/reservations/{r['id']}/approve/")
        assert response.status_code in (200, 409), response.content
        answers.append({"reservation": f"{team}-{i}", "status": response.status_code, "body": response.json()})
    # The first H100 order slips three months after the approvals counted on it.
    ok(send_json(w.operator, "patch", f"/api/v1/capacity/orders/{order_ids[0]}/", {"promised_on": str(month(5))}))
    return answers


# --- normalising and comparing ----------------------------------------------------------------

# Page links that carry a database id.
_URL_IDS = {
    "job": re.compile(r"(/training/jobs/)(\d+)(/)"),
    "endpoint": re.compile(r"(/serving/endpoints/)(\d+)(/)"),
}


def normalise(w: World, value: Any, kind_of: dict[str, str]) -> Any:
    """Replace database ids by the names of what they identify. ``kind_of`` maps a key (``id``,
    ``job_id``, ``pool`` ...) or a path of keys (``job/id``) to the kind of id it holds; a path
    ending in ``/<keys>`` names a dict whose keys are ids (the fleet series' per-site keys). Ids
    inside page links are named too. An id the test did not create fails the test."""

    def name(kind: str, pk: Any) -> str:
        if isinstance(pk, str) and pk.isdigit():
            pk = int(pk)
        assert pk in w.ids[kind], f"unknown {kind} id {pk!r}"
        return f"<{kind}:{w.ids[kind][pk]}>"

    def walk(v: Any, path: tuple[str, ...]) -> Any:
        if isinstance(v, dict):
            keys_kind = kind_of.get("/".join((*path, "<keys>")))
            out = {}
            for k, item in v.items():
                key = name(keys_kind, k) if keys_kind else k
                kind = kind_of.get("/".join((*path, k))) or kind_of.get(k)
                if kind and isinstance(item, int | str) and not isinstance(item, bool):
                    out[key] = name(kind, item)
                else:
                    out[key] = walk(item, (*path, k))
            return out
        if isinstance(v, list):
            return [walk(item, path) for item in v]
        if isinstance(v, str):
            for kind, pattern in _URL_IDS.items():
                v = pattern.sub(lambda m, kind=kind: m[1] + name(kind, m[2]) + m[3], v)
        return v

    return walk(value, ())


def differences(expected: Any, actual: Any, path: str = "$") -> Iterator[str]:
    """Where two JSON documents differ: keys, list lengths, types, values (floats to REL_TOL)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual), key=str):
            if key not in actual:
                yield f"{path}.{key}: missing (expected {json.dumps(expected[key])[:120]})"
            elif key not in expected:
                yield f"{path}.{key}: unexpected {json.dumps(actual[key])[:120]}"
            else:
                yield from differences(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            yield f"{path}: {len(actual)} items, expected {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
            yield from differences(e, a, f"{path}[{i}]")
    elif type(expected) is not type(actual):
        yield f"{path}: {json.dumps(actual)[:160]}, expected {json.dumps(expected)[:160]}"
    elif isinstance(expected, float):
        if not math.isclose(expected, actual, rel_tol=REL_TOL, abs_tol=1e-12):
            yield f"{path}: {actual!r}, expected {expected!r}"
    elif expected != actual:
        yield f"{path}: {json.dumps(actual)[:160]}, expected {json.dumps(expected)[:160]}"


class Goldens:
    """Compares documents with their goldens (or writes them), and reports every difference of
    every document at the end rather than stopping at the first."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.names: list[str] = []

    def check(self, name: str, document: Any) -> None:
        self.names.append(name)
        path = SNAPSHOTS / f"{name}.json"
        text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
        if WRITE:
            SNAPSHOTS.mkdir(exist_ok=True)
            path.write_text(text)
            return
        if not path.exists():
            self.failures.append(f"{name}: no golden {path}; run with GOODPUT_WRITE_SNAPSHOTS=1 to write it")
            return
        found = list(differences(json.loads(path.read_text()), json.loads(text)))
        if found:
            shown = "\n  ".join(found[:30]) + (f"\n  ... and {len(found) - 30} more" if len(found) > 30 else "")
            self.failures.append(f"{name}: {len(found)} difference(s) from {path.name}:\n  {shown}")

    def verify(self) -> None:
        assert not self.failures, "The API's answers changed:\n" + "\n".join(self.failures)
        if not WRITE:  # every golden on disk is still checked: none is left behind unread
            on_disk = sorted(p.stem for p in SNAPSHOTS.glob("*.json"))
            assert on_disk == sorted(self.names), f"goldens not checked: {sorted(set(on_disk) - set(self.names))}"


# --- the test ---------------------------------------------------------------------------------


def test_the_api_answers_for_a_seeded_fleet_match_the_goldens(world: World) -> None:
    w = world
    seed_gpus(w)
    seed_dcgm(w)
    endpoints = seed_serving(w)
    jobs = seed_training(w)
    approvals = seed_capacity(w)
    run_beat("update-rollups", "update-serving-rollups", "refresh-training-accounts", "advance-reservations")
    goldens = Goldens()

    # Serving: two endpoints' SLOs (vLLM with a restart and a slow spell; Triton with failures).
    for name in (VLLM_ENDPOINT, "bert_large"):
        slo = ok(w.viewer.get(f"/api/v1/serving/endpoints/{endpoints[name]}/slo"), 200)
        # Not a golden of nothing: traffic in every window, percentiles, a budget, a restart seen.
        ttft = slo["slo"]["ttft"]
        assert ttft["total"] > 0 and all(win["total"] > 0 for win in ttft["windows"].values()), ttft
        assert slo["slo"]["latency"]["period"]["ttft"]["p99"] is not None
        assert slo["slo"]["availability"]["total"] > 0 and slo["since_start"]["requests"]["requests_ok"] > 0
        goldens.check(f"serving-slo-{name.replace('_', '-')}", normalise(w, slo, {"endpoint/id": "endpoint"}))
    assert slo["slo"]["availability"]["sli"] < 1  # bert_large's failures count
    # The serving pages: every endpoint's last hour, and the vLLM endpoint's week (hour rollups).
    serving = ok(w.viewer.get("/api/v1/serving/overview"), 200)
    assert len(serving["endpoints"]) == 3 and serving["totals"]["alerts"] > 0, serving["totals"]
    goldens.check("serving-overview", normalise(w, serving, {"endpoints/id": "endpoint"}))
    page = ok(w.viewer.get(f"/api/v1/serving/endpoints/{endpoints[VLLM_ENDPOINT]}/snapshot", {"range": "7d"}), 200)
    assert len(page["changes"]) == 2 and len(page["evals"]) == 2 and page["step_seconds"] == 3600
    goldens.check("serving-endpoint-llama-70b-chat-7d", normalise(w, page, {"endpoint/id": "endpoint"}))

    # Training: the running job's page and the goodput overview.
    snapshot = ok(w.viewer.get(f"/api/v1/training/jobs/{jobs['llama-70b-pretrain']}/snapshot"), 200)
    account = snapshot["account"]
    assert 0 < account["goodput"] < 1 and account["gpu_s"]["disruption"] > 0 and account["steps"] > 100, account
    assert snapshot["losses"] and snapshot["advice"] and len(snapshot["series"]["gpus"]["ts"]) > 100
    goldens.check("training-job-snapshot", normalise(w, snapshot, {"job/id": "job", "advice/job_id": "job"}))
    overview = ok(w.viewer.get("/api/v1/training/overview", {"range": "24h"}), 200)
    assert overview["goodput"]["24h"]["allocated_gpu_h"] > 0 and len(overview["top_jobs"]) == 2, overview["goodput"]
    goldens.check("training-overview-24h", normalise(w, overview, {"id": "job", "job_id": "job"}))

    # Capacity: the plan, and what the approvals answered on the way.
    plan = ok(w.viewer.get("/api/v1/capacity/plan", {"months": "9"}), 200)
    total = plan["total"]
    assert len(total) == 9 and any(m["conflict"] for m in total) and total[-1]["installed"] > total[0]["installed"]
    assert total[0]["energised"] < total[0]["installed"] and any(m["reserved"]["preemptible"] for m in total)
    goldens.check("capacity-plan", normalise(w, plan, {"id": "pool", "queues/pool": "pool"}))
    assert {a["status"] for a in approvals} == {200, 409}
    goldens.check("capacity-approvals", normalise(w, approvals, {"id": "reservation", "pool": "pool"}))

    # The GPU-health detectors judge the seeded XIDs and ECC errors: "GPUs with XID / ECC errors" counts
    # the GPUs their open findings name. (After the plan: their incidents take GPUs out of service.)
    run_beat("run-detectors", times=1)

    # The fleet page: raw samples (15m), minute rollups (1h) and hour rollups (7d).
    for range_key in ("15m", "1h", "7d"):
        fleet = ok(w.viewer.get("/api/v1/fleet/overview/", {"range": range_key}), 200)
        totals = fleet["totals"]
        assert totals["gpus"] == 50 and 0 < totals["reporting"] < 50 and totals["with_errors"] > 0, totals
        assert len(fleet["series"]["sites"]) == 2 and all(s["ts"] for s in fleet["series"]["sites"].values())
        kinds = {"id": "site", "site_id": "site", "series/sites/<keys>": "site"}
        goldens.check(f"fleet-overview-{range_key}", normalise(w, fleet, kinds))

    goldens.verify()
