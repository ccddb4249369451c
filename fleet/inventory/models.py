"""Inventory: Site > Rack > Node > GPU, and a node's network interfaces and mounts."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.urls import reverse

from fleet.choices import ClaimKind, ClaimResolution, Fabric, Interconnect, InterfaceKind, MountPurpose


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


class ClaimConflictQuerySet(models.QuerySet["ClaimConflict"]):
    def pending(self) -> ClaimConflictQuerySet:
        """Not resolved yet: the claimant's samples for the value are held back."""
        return self.filter(resolved_at__isnull=True)


class ClaimConflict(models.Model):
    """A site's token sent a GPU UUID or hostname that belongs to another site. The samples that
    carry it are held back (not written) until an Admin resolves the claim: keep the GPU or node
    with its owner, or move it to the claimant (fleet.inventory.claims)."""

    kind = models.CharField(max_length=16, choices=ClaimKind.choices)
    value = models.CharField(max_length=253, help_text="The GPU UUID or hostname claimed")
    owner_site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="+", help_text="Whose it is")
    claimant_site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="+", help_text="Who sent it")
    claimant_hostname = models.CharField(
        max_length=253, blank=True, help_text="For a GPU: the hostname the claimant last sent it under"
    )
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    count = models.PositiveBigIntegerField(default=1, help_text="Requests that carried it")
    resolution = models.CharField(max_length=16, choices=ClaimResolution.choices, blank=True, default="")
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)

    objects = ClaimConflictQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen", "pk"]
        constraints = [
            # One open claim per value and claimant; a sighting adds to its count (claims.sighted).
            models.UniqueConstraint(
                fields=["kind", "value", "claimant_site"],
                condition=Q(resolved_at__isnull=True),
                name="claimconflict_one_pending_per_claimant",
            ),
            models.CheckConstraint(
                condition=Q(resolved_at__isnull=True, resolution="") | Q(resolved_at__isnull=False) & ~Q(resolution=""),
                name="claimconflict_resolved_with_a_resolution",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.value}: {self.owner_site} vs {self.claimant_site}"


# The fabric an interface serves unless an Operator sets another: RDMA ports (InfiniBand, RoCE)
# carry the collectives, plain Ethernet the management traffic.
DEFAULT_FABRIC = {
    InterfaceKind.IB: Fabric.COMPUTE,
    InterfaceKind.ROCE: Fabric.COMPUTE,
    InterfaceKind.ETHERNET: Fabric.MANAGEMENT,
}


# What follows a port's move to another fabric, called with (interface id, fabric before, after)
# in the save's transaction: the fabric page's throughput per fabric counts the port's bytes under
# its fabric (fleet.fabric registers its read model's move; inventory cannot import fabric).
_fabric_changes: list[Callable[[int, str, str], None]] = []


def on_fabric_change(callback: Callable[[int, str, str], None]) -> None:
    if callback not in _fabric_changes:
        _fabric_changes.append(callback)


class NodeInterface(models.Model):
    """A node's network port, created when node_exporter first reports it: an InfiniBand port
    (``mlx5_0/1``: device and port) or a network interface (``eth0``)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="interfaces")
    name = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=InterfaceKind.choices)
    rate_bytes_per_second = models.FloatField(null=True, blank=True, help_text="The port's rated speed")
    fabric = models.CharField(
        max_length=16, choices=Fabric.choices, blank=True, help_text="Defaults from the kind (IB, RoCE: compute)"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node__hostname", "name"]
        constraints = [models.UniqueConstraint(fields=["node", "name"], name="interface_unique_per_node")]

    def __str__(self) -> str:
        return f"{self.node.hostname}:{self.name}"

    def save(self, *args: object, **kwargs: object) -> None:
        if not self.fabric:
            self.fabric = DEFAULT_FABRIC[InterfaceKind(self.kind)]
        before = (
            NodeInterface.objects.filter(pk=self.pk).values_list("fabric", flat=True).first()
            if self.pk is not None
            else None
        )
        with transaction.atomic():
            super().save(*args, **kwargs)
            if before is not None and before != self.fabric:
                for moved in _fabric_changes:
                    moved(self.pk, before, self.fabric)


def purpose_of_mountpoint(mountpoint: str) -> str:
    """A new mount's purpose guessed from its path (an Operator corrects it: PATCH
    /api/v1/fleet/mounts/<id>/, or the admin): a path part naming checkpoints (``checkpoint*``,
    ``ckpt*``) or datasets (``dataset*``, ``data``)."""
    parts = [p.lower() for p in mountpoint.split("/") if p]
    if any(p.startswith(("checkpoint", "ckpt")) for p in parts):
        return MountPurpose.CHECKPOINTS
    if any(p.startswith("dataset") or p == "data" for p in parts):
        return MountPurpose.DATASETS
    return MountPurpose.OTHER


class NodeMount(models.Model):
    """A file system mounted on a node, created when node_exporter first reports it."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="mounts")
    mountpoint = models.CharField(max_length=512)
    fstype = models.CharField(max_length=32)
    device = models.CharField(max_length=255, blank=True)
    purpose = models.CharField(max_length=16, choices=MountPurpose.choices, default=MountPurpose.OTHER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node__hostname", "mountpoint"]
        constraints = [models.UniqueConstraint(fields=["node", "mountpoint"], name="mount_unique_per_node")]

    def __str__(self) -> str:
        return f"{self.node.hostname}:{self.mountpoint}"
