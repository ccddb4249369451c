from fleet.models.inventory import Gpu, Node, Rack, Site
from fleet.models.scraping import ScrapeTarget
from fleet.models.serving import (
    Endpoint,
    EndpointChange,
    EndpointChangeKind,
    EndpointEval,
    ServingRollup1h,
    ServingRollup1m,
    ServingRollupDirty,
    ServingSample,
)
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
from fleet.models.training import Job, JobAccount, JobEvent

__all__ = [
    "Endpoint",
    "EndpointChange",
    "EndpointChangeKind",
    "EndpointEval",
    "Gpu",
    "GpuRollup1h",
    "GpuRollup1m",
    "GpuSample",
    "GpuState",
    "GroupRollup1h",
    "GroupRollup1m",
    "IngestBatch",
    "Job",
    "JobAccount",
    "JobEvent",
    "Node",
    "PartitionDrop",
    "Rack",
    "RollupDirty",
    "ScrapeTarget",
    "ServingRollup1h",
    "ServingRollup1m",
    "ServingRollupDirty",
    "ServingSample",
    "Site",
]
