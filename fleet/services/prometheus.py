"""Prometheus text exposition in: dcgm-exporter, vLLM, Triton and TGI scrapes, as pushed or scraped.

Parsing uses prometheus_client's parser. DCGM fields become GPU samples (the same schema and
writer as the JSON door); serving metrics (gauges, counters, histogram buckets) are stored per
endpoint as raw series for the serving SLO work. A malformed exposition is refused whole with
the line at fault; nothing is written.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
from django.conf import settings
from django.db import connection, transaction
from prometheus_client.parser import text_fd_to_metric_families

from console import counters
from fleet.choices import ServingFramework
from fleet.models import Endpoint
from fleet.services import partitions
from fleet.services.ingest import GpuBatchIn, GpuSampleIn, IngestError, check_site_scope, invalid_identity
from fleet.services.telemetry import store_gpu_samples
from fleet.telemetry_fields import FIELDS_BY_NAME, GPU_SAMPLE_FIELDS

DCGM_FIELDS = {f.dcgm: f.name for f in GPU_SAMPLE_FIELDS}
# Older releases name the clocks-event bitmask after throttling.
DCGM_FIELDS["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = "throttle_reasons"
# Fields DCGM reports as 64-bit integers (counters); the rest are 32-bit integers or doubles.
INT64_FIELDS = {"energy_mj", "ecc_sbe_total", "ecc_dbe_total", "pcie_replay_total", "nvlink_crc_errors_total"}
# DCGM's "blank" sentinels (dcgm_structs.h): values at or above these mean "no value", never data.
INT32_BLANK = 0x7FFFFFF0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0

SERVING_PREFIXES = {
    "vllm:": ServingFramework.VLLM,
    "nv_inference_": ServingFramework.TRITON,
    "nv_": ServingFramework.TRITON,
    "tgi_": ServingFramework.TGI,
}
# The label that names the served model, per framework: it identifies the endpoint.
MODEL_LABELS = {ServingFramework.VLLM: "model_name", ServingFramework.TRITON: "model", ServingFramework.TGI: ""}
MAX_LINES = 200_000
KINDS = ("auto", "dcgm", "vllm", "triton", "tgi")


@dataclass
class ServingPoint:
    endpoint: str
    framework: str
    model_name: str
    ts: datetime
    metric: str
    series: str
    value: float


@dataclass
class Exposition:
    gpu_samples: list[Any] = field(default_factory=list)
    serving: list[ServingPoint] = field(default_factory=list)
    ignored: int = 0  # samples of metrics this console does not store

    @property
    def count(self) -> int:
        return len(self.gpu_samples) + len(self.serving)


class _Lines:
    """Feeds the parser line by line, remembering the line number and the declared counters."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.number = 0  # the line the parser is reading (exact when it raises)
        self.declared: set[str] = set()
        # The parser hands samples over a family at a time, after reading ahead; each sample line
        # holds one sample, in order, so the n-th sample handed over came from sample_lines[n].
        self.sample_lines: list[int] = []

    def __iter__(self) -> Iterator[str]:
        for number, line in enumerate(self.lines, start=1):
            self.number = number
            stripped = line.strip()
            if stripped.startswith("# TYPE "):
                parts = stripped.split()
                if len(parts) >= 3:
                    self.declared.add(parts[2])
            elif stripped and not stripped.startswith("#"):
                self.sample_lines.append(number)
            yield line

    def exposed_name(self, sample_name: str, family_type: str) -> str:
        """prometheus_client appends _total to counter samples; give back the name as exposed."""
        if family_type == "counter" and sample_name not in self.declared:
            base = sample_name.removesuffix("_total")
            if base in self.declared:
                return base
        return sample_name


def _blank(name: str, value: float) -> bool:
    """Is this DCGM's "no value" sentinel? Outside the 64-bit counters no real reading comes near
    2**31 (temperatures, clocks, watts, MiB), so the 32-bit threshold also catches the 64-bit and
    floating-point sentinels (DCGM_FP64_BLANK is 2**47)."""
    return value >= (INT64_BLANK if name in INT64_FIELDS else INT32_BLANK)


def _framework(name: str) -> str | None:
    for prefix, framework in SERVING_PREFIXES.items():
        if name.startswith(prefix):
            return framework
    return None


def _series(labels: dict[str, str], skip: str) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != skip)


def parse_exposition(
    text: str,
    *,
    hostname: str | None = None,
    endpoint: str | None = None,
    kind: str = "auto",
    now: str | datetime | None = None,
) -> Exposition:
    """Parse and validate a whole exposition; raise IngestError naming the line at fault."""
    received = datetime.fromisoformat(now) if isinstance(now, str) else (now or datetime.now(UTC))
    if len(text.encode()) > settings.INGEST_MAX_BYTES:
        raise IngestError(413, f"Body is larger than the limit of {settings.INGEST_MAX_BYTES} bytes.")
    lines = _Lines(text)
    if len(lines.lines) > MAX_LINES:
        raise IngestError(413, f"The exposition has {len(lines.lines)} lines; at most {MAX_LINES}.")
    gpus: dict[str, dict[str, Any]] = {}
    origin: dict[tuple[str, str], int] = {}  # (uuid, field) -> line, to name the line of a bad value
    out = Exposition()
    handed = 0
    try:
        for family in text_fd_to_metric_families(iter(lines)):
            for sample in family.samples:
                line = lines.sample_lines[handed] if handed < len(lines.sample_lines) else lines.number
                handed += 1
                name = lines.exposed_name(sample.name, family.type)
                ts = datetime.fromtimestamp(sample.timestamp, UTC) if sample.timestamp else received
                field_name = DCGM_FIELDS.get(name)
                if field_name is not None and kind in ("auto", "dcgm"):
                    _add_gpu_value(gpus, origin, line, field_name, sample.labels, sample.value, ts, hostname)
                    continue
                framework = _framework(name)
                if framework is not None and kind in ("auto", framework):
                    point = _serving_point(name, framework, sample.labels, sample.value, ts, endpoint, line)
                    if point is not None:
                        out.serving.append(point)
                    continue
                out.ignored += 1
    except IngestError:
        raise
    except (ValueError, IndexError, KeyError) as exc:
        raise IngestError(
            400,
            f"line {lines.number}: cannot parse ({exc}): {lines.lines[lines.number - 1][:200]!r}",
            item=lines.number,
        ) from None
    out.gpu_samples = _validated_gpu_samples(gpus, origin)
    return out


def _add_gpu_value(
    gpus: dict[str, dict[str, Any]],
    origin: dict[tuple[str, str], int],
    line: int,
    name: str,
    labels: dict[str, str],
    value: float,
    ts: datetime,
    hostname: str | None,
) -> None:
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        raise IngestError(400, f"line {line}: a DCGM sample without a UUID label.", item=line, field="UUID")
    host = labels.get("hostname") or labels.get("Hostname") or hostname
    if not host:
        raise IngestError(
            400,
            f"line {line}: no hostname or Hostname label; pass ?hostname= for this exporter.",
            item=line,
            field="hostname",
        )
    parent = None
    mig_id = labels.get("GPU_I_ID")
    if mig_id not in (None, ""):
        # A MIG instance: its own row, under the physical GPU.
        parent, uuid = uuid, f"MIG-{uuid.removeprefix('GPU-')}-gi{mig_id}"
    gpu = gpus.get(uuid)
    if gpu is None:
        gpu = gpus[uuid] = {"gpu_uuid": uuid, "hostname": host, "ts": ts}
        if labels.get("gpu", "").isdigit():
            gpu["gpu_index"] = int(labels["gpu"])
        if labels.get("modelName"):
            gpu["model"] = labels["modelName"][:64]
        if parent:
            gpu["parent_uuid"] = parent
            gpu["mig_profile"] = labels.get("GPU_I_PROFILE", "")[:32]
    gpu["ts"] = max(gpu["ts"], ts)
    origin[(uuid, name)] = line
    if math.isnan(value) or _blank(name, value):
        gpu[name] = None
    else:
        gpu[name] = value if FIELDS_BY_NAME[name].kind is float else int(value)


def _validated_gpu_samples(gpus: dict[str, dict[str, Any]], origin: dict[tuple[str, str], int]) -> list[Any]:
    samples = []
    for uuid, values in gpus.items():
        try:
            sample = msgspec.convert(values, GpuSampleIn)
        except msgspec.ValidationError as exc:
            text = str(exc)
            name = text.rsplit("$.", 1)[-1].rstrip("`") if "$." in text else None
            line = origin.get((uuid, name or ""))
            where = f"line {line}: " if line else ""
            raise IngestError(400, f"{where}{name or 'value'} of {uuid}: {text}", item=line, field=name) from None
        if field := invalid_identity(sample):
            line = min(ln for (u, _), ln in origin.items() if u == uuid)
            raise IngestError(
                400, f"line {line}: malformed {field} {getattr(sample, field)!r} (a label).", item=line, field=field
            )
        samples.append(sample)
    return samples


def _serving_point(
    name: str,
    framework: str,
    labels: dict[str, str],
    value: float,
    ts: datetime,
    endpoint: str | None,
    line: int,
) -> ServingPoint | None:
    if math.isnan(value):
        return None
    model_label = MODEL_LABELS[framework]
    model = labels.get(model_label, "") if model_label else ""
    version = labels.get("version", "") if framework == ServingFramework.TRITON else ""
    name_for_endpoint = endpoint or (f"{model}:{version}" if version else model)
    if not name_for_endpoint:
        raise IngestError(
            400,
            f"line {line}: cannot tell which endpoint {name} belongs to; pass ?endpoint=NAME.",
            item=line,
            field="endpoint",
        )
    return ServingPoint(
        endpoint=name_for_endpoint[:200],
        framework=framework,
        model_name=model[:200],
        ts=ts,
        metric=name[:200],
        series=_series(labels, model_label)[:500],
        value=value,
    )


# --- storing --------------------------------------------------------------------------------


def exposition_key(*, site_id: int, body: str, idempotency_key: str | None, options: dict[str, Any]) -> str:
    if idempotency_key:
        return f"{site_id}:k:{idempotency_key}"
    digest = hashlib.sha256(body.encode())
    digest.update(repr(sorted((k, v) for k, v in options.items() if k != "now")).encode())
    return f"{site_id}:p:{digest.hexdigest()}"


def check_scope(exposition: Exposition, *, site_id: int) -> None:
    if exposition.gpu_samples:
        check_site_scope(GpuBatchIn(samples=exposition.gpu_samples), site_id=site_id)


def store_exposition(
    exposition: Exposition, *, site_id: int, batch_key: str, enqueued_at: datetime | None = None
) -> int:
    """Store the GPU samples and the serving series; each part is idempotent under its own key."""
    stored = 0
    if exposition.gpu_samples:
        stored += store_gpu_samples(
            site_id=site_id, batch_key=f"{batch_key}:gpu", samples=exposition.gpu_samples, enqueued_at=enqueued_at
        )
    if exposition.serving:
        stored += store_serving_points(site_id=site_id, batch_key=f"{batch_key}:serving", points=exposition.serving)
    return stored


def store_serving_points(*, site_id: int, batch_key: str, points: list[ServingPoint]) -> int:
    from fleet.services.telemetry import claim_batch_keys

    first, last = min(p.ts for p in points), max(p.ts for p in points)

    def write() -> int:
        with transaction.atomic():
            if not claim_batch_keys([(batch_key, site_id, len(points), None)]):
                return 0
            endpoint_ids = _resolve_endpoints(site_id, points)
            with (
                connection.cursor() as cursor,
                cursor.cursor.copy(
                    "COPY fleet_servingsample (endpoint_id, ts, metric, series, value) FROM STDIN (FORMAT BINARY)"
                ) as copy,
            ):
                copy.set_types(["int8", "timestamptz", "text", "text", "float8"])
                for p in points:
                    copy.write_row((endpoint_ids[p.endpoint], p.ts, p.metric, p.series, p.value))
        return len(points)

    stored = partitions.write_with_partitions(partitions.SERVING_SAMPLES, first, last, write)
    if stored:
        counters.increment("goodput_ingest_samples_stored_total", stored)
    return stored


def _resolve_endpoints(site_id: int, points: list[ServingPoint]) -> dict[str, int]:
    wanted = {p.endpoint: p for p in points}
    Endpoint.objects.bulk_create(
        [
            Endpoint(site_id=site_id, name=n, framework=p.framework, model_name=p.model_name)
            for n, p in sorted(wanted.items())
        ],
        ignore_conflicts=True,
    )
    return dict(Endpoint.objects.filter(site_id=site_id, name__in=wanted).values_list("name", "id"))
