"""vLLM's, Triton's and TGI's series: serving's entries in the exporter mapping table
(fleet.exporters), registered from fleet/serving/plugins.py. Every name under a framework's
prefix is a series of one endpoint (gauges, counters, histogram buckets), stored raw per endpoint
(fleet.serving.store) for the SLO reads."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.choices import ServingFramework
from fleet.exporters import SERVING, ExporterMapping
from fleet.serving.store import store_serving_points


@dataclass(frozen=True)
class ServingSeries:
    framework: str  # fleet.choices.ServingFramework
    model_label: str  # the label that names the served model: it identifies the endpoint ("": none)
    # A series without its model label is not the server's (Triton's GPU and CPU series,
    # nv_gpu_utilization, nv_energy_consumption, nv_cpu_*: dcgm-exporter is the GPU source, and two
    # sources would fight over one GPU's state): ignored.
    model_required: bool = False


VLLM = ServingSeries(ServingFramework.VLLM, "model_name")
TRITON = ServingSeries(ServingFramework.TRITON, "model", model_required=True)
TGI = ServingSeries(ServingFramework.TGI, "")

MAPPINGS = tuple(
    ExporterMapping(
        series.framework, SERVING, store_serving_points, prefix=prefix, spec=series, kinds=("auto", series.framework)
    )
    for prefix, series in (("vllm:", VLLM), ("nv_", TRITON), ("tgi_", TGI))
)
