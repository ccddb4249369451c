"""Inventory: Site > Rack > Node > GPU."""

from __future__ import annotations

from django.db import models
from django.urls import reverse

from fleet.choices import Interconnect


class Site(models.Model):
    name = models.SlugField(max_length=64, unique=True, help_text="Short name, e.g. ams-1")
    region = models.CharField(max_length=64, blank=True)
    contracted_power_kw = models.DecimalField(
        max_digits=10, decimal_places=1, null=True, blank=True, help_text="Grid power contracted for the site (kW)"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Rack(models.Model):
    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="racks")
    name = models.CharField(max_length=64)
    power_budget_kw = models.DecimalField(max_digits=8, decimal_places=1, null=True, blank=True)

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "name"], name="rack_unique_per_site")]

    def __str__(self) -> str:
        return f"{self.site.name}/{self.name}"


class Node(models.Model):
    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="nodes")
    rack = models.ForeignKey(Rack, on_delete=models.SET_NULL, null=True, blank=True, related_name="nodes")
    hostname = models.CharField(max_length=253, unique=True)
    instance_type = models.CharField(max_length=64, blank=True, help_text="e.g. p5.48xlarge, DGX H100")
    interconnect = models.CharField(max_length=16, choices=Interconnect.choices, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    def get_absolute_url(self) -> str:
        return reverse("fleet:node_detail", args=[self.hostname])


class GpuQuerySet(models.QuerySet["Gpu"]):
    def physical(self) -> GpuQuerySet:
        """Physical GPUs only: a MIG instance is a slice of its parent and never counts on its own
        in a total (GPUs, power, capacity)."""
        return self.filter(parent__isnull=True)

    def mig_instances(self) -> GpuQuerySet:
        return self.filter(parent__isnull=False)


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True, help_text="NVML UUID (GPU-..., MIG-... for a MIG instance)")
    parent = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="mig_instances",
        help_text="The physical GPU of a MIG instance",
    )
    mig_profile = models.CharField(max_length=32, blank=True, help_text="MIG profile, e.g. 1g.10gb")
    mig_instance_id = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="MIG GPU instance id (dcgm-exporter's GPU_I_ID)"
    )
    model = models.CharField(max_length=64, blank=True, help_text="e.g. NVIDIA H100 80GB HBM3")
    hbm_gib = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = GpuQuerySet.as_manager()

    class Meta:
        ordering = ["node__hostname", "index", "mig_instance_id"]
        verbose_name = "GPU"
        verbose_name_plural = "GPUs"

    def __str__(self) -> str:
        return f"{self.node.hostname}/{self.label}"

    def get_absolute_url(self) -> str:
        return reverse("fleet:gpu_detail", args=[self.uuid])

    @property
    def is_mig_instance(self) -> bool:
        return self.parent_id is not None

    @property
    def label(self) -> str:
        """gpu3, or gpu3 · MIG 3g.40gb #2 for an instance of it."""
        if self.parent_id is None:
            return f"gpu{self.index}"
        instance = f" #{self.mig_instance_id}" if self.mig_instance_id is not None else ""
        return f"gpu{self.index} · MIG {self.mig_profile or '?'}{instance}"
