from fleet.models.inventory import Gpu, Node, Rack, Site
from fleet.models.telemetry import GpuSample, GpuState, IngestBatch

__all__ = ["Gpu", "GpuSample", "GpuState", "IngestBatch", "Node", "Rack", "Site"]
