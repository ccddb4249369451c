"""The GPU sample fields: one list that the ingest schema, the table and the writer all derive from.

Units and ranges follow dcgm-exporter / NVML (see shared/REFERENCE.md). Every metric is optional:
an agent sends what its GPU supports, and "not supported" is stored as NULL, never as a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Annotated, Any

import msgspec


@dataclass(frozen=True)
class Field:
    name: str
    kind: type  # int or float
    minimum: float
    maximum: float
    unit: str
    dcgm: str  # the dcgm-exporter metric the value corresponds to
    help: str


# Upper bounds are generous physical limits: they reject garbage (and infinity) without
# second-guessing real hardware.
GPU_SAMPLE_FIELDS: tuple[Field, ...] = (
    Field("gpu_util", float, 0, 100, "%", "DCGM_FI_DEV_GPU_UTIL", "GPU utilisation"),
    Field("mem_copy_util", float, 0, 100, "%", "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory copy utilisation"),
    Field("fb_used_mib", float, 0, 2**24, "MiB", "DCGM_FI_DEV_FB_USED", "Framebuffer memory used"),
    Field("fb_free_mib", float, 0, 2**24, "MiB", "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free"),
    Field("gpu_temp_c", float, -50, 200, "°C", "DCGM_FI_DEV_GPU_TEMP", "GPU temperature"),
    Field("memory_temp_c", float, -50, 200, "°C", "DCGM_FI_DEV_MEMORY_TEMP", "HBM temperature"),
    Field("power_w", float, 0, 5000, "W", "DCGM_FI_DEV_POWER_USAGE", "Power draw"),
    Field("sm_clock_mhz", float, 0, 10000, "MHz", "DCGM_FI_DEV_SM_CLOCK", "SM clock"),
    Field("mem_clock_mhz", float, 0, 20000, "MHz", "DCGM_FI_DEV_MEM_CLOCK", "Memory clock"),
    Field("energy_mj", int, 0, 2**62, "mJ", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Energy since boot"),
    Field("xid", int, 0, 100000, "", "DCGM_FI_DEV_XID_ERRORS", "Last XID error (0: none)"),
    Field("ecc_sbe_total", int, 0, 2**62, "", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Single-bit ECC errors"),
    Field("ecc_dbe_total", int, 0, 2**62, "", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Double-bit ECC errors"),
    Field(
        "remapped_rows_uncorrectable",
        int,
        0,
        2**31,
        "",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for uncorrectable errors",
    ),
    Field(
        "remapped_rows_correctable",
        int,
        0,
        2**31,
        "",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for correctable errors",
    ),
    Field("row_remap_failure", int, 0, 1, "", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "Row remapping failed"),
    Field("pcie_replay_total", int, 0, 2**62, "", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replays"),
    Field(
        "nvlink_crc_errors_total",
        int,
        0,
        2**62,
        "",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "NVLink CRC flit errors",
    ),
    Field("throttle_reasons", int, 0, 2**32, "", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Clock event reasons bitmask"),
    Field("tensor_active", float, 0, 1, "ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Tensor pipe activity"),
    Field("sm_active", float, 0, 1, "ratio", "DCGM_FI_PROF_SM_ACTIVE", "SM activity"),
    # What a MIG instance reports of itself (dcgm-exporter gives instances mostly profiling fields).
    Field("gr_engine_active", float, 0, 1, "ratio", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Graphics engine activity"),
    Field("dram_active", float, 0, 1, "ratio", "DCGM_FI_PROF_DRAM_ACTIVE", "Memory interface activity"),
    # Older dcgm-exporter set-ups export no clocks-event bitmask, only these cumulative counters of
    # time spent throttled; a rise between two samples is throttling.
    Field(
        "thermal_violation_us",
        int,
        0,
        2**62,
        "µs",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "Time throttled by thermal limits (cumulative)",
    ),
    Field(
        "power_violation_us",
        int,
        0,
        2**62,
        "µs",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "Time throttled by power limits (cumulative)",
    ),
)

# Fields a MIG instance has of its own. Everything else (power, temperatures, clocks, energy, ECC,
# XIDs, throttling) belongs to the physical GPU, whatever labels an exporter puts on it.
MIG_INSTANCE_FIELDS = frozenset(
    {"gpu_util", "fb_used_mib", "fb_free_mib", "gr_engine_active", "sm_active", "tensor_active", "dram_active"}
)
# Cumulative counters: a decrease is a reset (driver reload, reboot), as in Prometheus increase().
COUNTER_FIELDS = frozenset(
    {
        "energy_mj",
        "ecc_sbe_total",
        "ecc_dbe_total",
        "pcie_replay_total",
        "nvlink_crc_errors_total",
        "thermal_violation_us",
        "power_violation_us",
    }
)

METRIC_NAMES: tuple[str, ...] = tuple(f.name for f in GPU_SAMPLE_FIELDS)
FIELDS_BY_NAME = {f.name: f for f in GPU_SAMPLE_FIELDS}


# --- a sample as the JSON door validates it and as the queue carries it to the writers ------------


def _metric_type(kind: type, minimum: float, maximum: float) -> Any:
    return Annotated[kind, msgspec.Meta(ge=minimum, le=maximum)] | None


# (name, validated type, plain type, default): the schema the API checks, and the same fields
# unchecked for the queue between the API and the writers.
_NO_DEFAULT = msgspec.NODEFAULT
_SAMPLE_FIELDS: list[tuple[str, Any, Any, Any]] = [
    # The identity patterns are checked after decoding, once per distinct value (_check_identities):
    # a batch names a few hundred GPUs a thousand times, and a regex per sample cost more than the
    # rest of the validation together.
    ("gpu_uuid", Annotated[str, msgspec.Meta(max_length=64)], str, _NO_DEFAULT),
    ("hostname", Annotated[str, msgspec.Meta(max_length=253)], str, _NO_DEFAULT),
    ("ts", Annotated[datetime, msgspec.Meta(tz=True)], datetime, _NO_DEFAULT),
    ("gpu_index", Annotated[int, msgspec.Meta(ge=0, le=1023)] | None, int | None, None),
    ("model", Annotated[str, msgspec.Meta(max_length=64)] | None, str | None, None),
    # A MIG instance names its physical GPU and its profile (e.g. 1g.10gb).
    ("parent_uuid", Annotated[str, msgspec.Meta(max_length=64)] | None, str | None, None),
    ("mig_profile", Annotated[str, msgspec.Meta(max_length=32)] | None, str | None, None),
    *[(f.name, _metric_type(f.kind, f.minimum, f.maximum), f.kind | None, None) for f in GPU_SAMPLE_FIELDS],
    # Fields added later go last: the queue carries samples as positional arrays, and an array
    # written before a field existed must still decode (a missing tail takes its defaults).
    ("mig_instance_id", Annotated[int, msgspec.Meta(ge=0, le=32767)] | None, int | None, None),
]
# Where the metrics sit in a sample's field tuple (telemetry.copyrows slices them out).
METRICS_START = next(i for i, f in enumerate(_SAMPLE_FIELDS) if f[0] == GPU_SAMPLE_FIELDS[0].name)
METRICS_END = METRICS_START + len(GPU_SAMPLE_FIELDS)


def _struct_fields(*, checked: bool) -> list[tuple[str, Any] | tuple[str, Any, Any]]:
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for name, validated, plain, default in _SAMPLE_FIELDS:
        kind = validated if checked else plain
        fields.append((name, kind) if default is _NO_DEFAULT else (name, kind, default))
    return fields


GpuSampleIn = msgspec.defstruct(
    "GpuSampleIn", _struct_fields(checked=True), forbid_unknown_fields=True, kw_only=True, gc=False
)
# A sample that already passed GpuSampleIn, as the queue carries it while its GPU is not yet
# registered (registered GPUs' samples go as COPY rows, telemetry.copyrows): a MessagePack array
# in the same field order.
GpuSampleRow = msgspec.defstruct("GpuSampleRow", _struct_fields(checked=False), array_like=True, gc=False)

# A sample's identity fields and timestamp, read in C (``map(uuid_of, samples)``): the door and the
# writer walk every sample of a batch for them.
uuid_of = attrgetter("gpu_uuid")
parent_of = attrgetter("parent_uuid")
hostname_of = attrgetter("hostname")
ts_of = attrgetter("ts")
