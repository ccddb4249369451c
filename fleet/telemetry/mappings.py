"""dcgm-exporter's fields: telemetry's entry in the exporter mapping table (fleet.exporters),
registered from fleet/telemetry/plugins.py. Each DCGM field maps to one GpuSample field
(fleet.telemetry.fields), stored by the GPU-sample writer the JSON door uses."""

from __future__ import annotations

from fleet.exporters import GPU_FIELD, ExporterMapping
from fleet.telemetry.fields import GPU_SAMPLE_FIELDS
from fleet.telemetry.store import store_gpu_batches

DCGM_FIELDS = {f.dcgm: f.name for f in GPU_SAMPLE_FIELDS}
# Older releases name the clocks-event bitmask after throttling.
DCGM_FIELDS["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = "throttle_reasons"
# dcgm-exporter's NVLink series (etc/default-counters.csv; the throughput pair are DCGM profiling
# fields 1011/1012) that the console knows but does not store yet: a GPU sample has no column for
# them (storing them takes new GpuSample / rollup columns and a migration). They are ignored and
# counted in ``ignored`` / ``ignored_metrics`` like any series this console does not use. The CRC
# flit errors are stored (nvlink_crc_errors_total).
DCGM_KNOWN_UNSTORED = frozenset(
    {
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    }
)

MAPPINGS = (
    ExporterMapping("dcgm-exporter", GPU_FIELD, store_gpu_batches, families=DCGM_FIELDS, kinds=("auto", "dcgm")),
)
