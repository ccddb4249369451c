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
