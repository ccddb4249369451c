from django.db import models


class Interconnect(models.TextChoices):
    NVLINK = "nvlink", "NVLink / NVSwitch"
    PCIE = "pcie", "PCIe only"
    INFINIBAND = "infiniband", "NVLink + InfiniBand"
    ROCE = "roce", "NVLink + RoCE"
    UNKNOWN = "", "Unknown"


class GpuHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"
    STALE = "stale", "No recent data"


class ServingFramework(models.TextChoices):
    VLLM = "vllm", "vLLM"
    TRITON = "triton", "Triton"
    TGI = "tgi", "Text Generation Inference"
    OTHER = "other", "Other"


class ScrapeKind(models.TextChoices):
    AUTO = "auto", "Detect from the metric names"
    DCGM = "dcgm", "dcgm-exporter"
    VLLM = "vllm", "vLLM"
    TRITON = "triton", "Triton"
    TGI = "tgi", "TGI"


class ScrapeHealth(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    UP = "up", "Up"
    DOWN = "down", "Down"
