from fleet.models.inventory import Gpu, Node, Rack, Site
from fleet.models.scraping import ScrapeTarget
from fleet.models.serving import Endpoint, ServingSample
from fleet.models.telemetry import (
    GpuRollup1h,
    GpuRollup1m,
    GpuSample,
    GpuState,
    GroupRollup1h,
    GroupRollup1m,
    IngestBatch,
    PartitionDrop,
    RollupDirty,
)

__all__ = [
    "Endpoint",
    "Gpu",
    "GpuRollup1h",
    "GpuRollup1m",
    "GpuSample",
    "GpuState",
    "GroupRollup1h",
    "GroupRollup1m",
    "IngestBatch",
    "Node",
    "PartitionDrop",
    "Rack",
    "RollupDirty",
    "ScrapeTarget",
    "ServingSample",
    "Site",
]
