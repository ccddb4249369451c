"""Capacity: GPU pools per site and model, the supply that lands on them (procurement orders, grid
approvals), team quotas (Kueue's nominal quota and borrowing limit) and reservations.

The figures (installed, energised, healthy, reserved) are computed by fleet.capacity.services,
never stored: they follow the inventory, the rack budgets and the open incidents as they change.
"""

from __future__ import annotations

from datetime import date, timedelta

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q

from fleet.choices import PriorityTier
from fleet.inventory.models import Site


class OrderStatus(models.TextChoices):
    ORDERED = "ordered", "Ordered"
    SHIPPED = "shipped", "Shipped"
    DELIVERED = "delivered", "Delivered"
    CANCELLED = "cancelled", "Cancelled"


class ApprovalStatus(models.TextChoices):
    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    ENERGISED = "energised", "Energised"
    REJECTED = "rejected", "Rejected"


class ReservationState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    ACTIVE = "active", "Active"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


# Reservations that hold capacity: approved (not started yet) and active (running now).
COMMITTED_STATES = (ReservationState.APPROVED, ReservationState.ACTIVE)


class Pool(models.Model):
    """The GPUs of one model at one site, counted as a whole (``gpu_model`` is the Gpu.model name)."""

    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="pools")
    gpu_model = models.CharField(max_length=64, help_text="The Gpu.model it counts, e.g. NVIDIA H100 80GB HBM3")
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "gpu_model"], name="pool_unique_model_per_site")]

    def __str__(self) -> str:
        return f"{self.site.name}/{self.name}"


class ProcurementOrder(models.Model):
    """GPUs bought for a pool. Undelivered, they count as future supply from the promised date,
    unless late (promised date past): a late order counts nowhere until it is delivered."""

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="orders")
    count = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    ordered_on = models.DateField()
    promised_on = models.DateField(help_text="Promised delivery date")
    delivered_on = models.DateField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=OrderStatus.choices, default=OrderStatus.ORDERED)
    vendor = models.CharField(max_length=100, blank=True)
    reference = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["promised_on", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(count__gt=0), name="order_count_positive"),
            models.CheckConstraint(condition=Q(promised_on__gte=F("ordered_on")), name="order_promised_after_ordered"),
        ]

    def __str__(self) -> str:
        return f"{self.count} x {self.pool} ({self.reference or self.pk})"

    @property
    def lead_time_days(self) -> int:
        """Promised lead time: ordered to promised delivery."""
        return (self.promised_on - self.ordered_on).days

    @property
    def actual_lead_time_days(self) -> int | None:
        return (self.delivered_on - self.ordered_on).days if self.delivered_on else None

    def is_late(self, today: date) -> bool:
        """Not delivered by its promised date (still open past it, or delivered after it)."""
        if self.status == OrderStatus.CANCELLED:
            return False
        if self.delivered_on is not None:
            return self.delivered_on > self.promised_on
        return self.promised_on < today


class PowerApproval(models.Model):
    """Grid or power approval adding kW to a site, energised from its expected date once approved."""

    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="power_approvals")
    added_kw = models.DecimalField(max_digits=10, decimal_places=1, validators=[MinValueValidator(0.1)])
    expected_on = models.DateField()
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.REQUESTED)
    reference = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["expected_on", "pk"]
        constraints = [models.CheckConstraint(condition=Q(added_kw__gt=0), name="approval_added_kw_positive")]

    def __str__(self) -> str:
        return f"+{self.added_kw} kW at {self.site} ({self.reference or self.pk})"


class TeamQuota(models.Model):
    """Kueue's quota for a team on a pool: it may hold up to nominal + borrowing limit GPUs, the
    borrowed part only out of other teams' unused nominal quota."""

    team = models.CharField(max_length=100)
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="quotas")
    nominal_gpus = models.PositiveIntegerField()
    borrowing_limit_gpus = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["pool", "team"]
        constraints = [models.UniqueConstraint(fields=["team", "pool"], name="quota_unique_team_per_pool")]

    def __str__(self) -> str:
        return f"{self.team} on {self.pool}: {self.nominal_gpus} (+{self.borrowing_limit_gpus})"


class ReservationQuerySet(models.QuerySet["Reservation"]):
    def committed(self) -> ReservationQuerySet:
        """Approved or active: what holds capacity."""
        return self.filter(state__in=COMMITTED_STATES)

    def overlapping(self, start: object, end: object) -> ReservationQuerySet:
        """Reservations whose [start, end) meets [start, end)."""
        return self.filter(start__lt=end, end__gt=start)


class Reservation(models.Model):
    team = models.CharField(max_length=100)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="reservations")
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    start = models.DateTimeField()
    end = models.DateTimeField()
    tier = models.CharField(max_length=16, choices=PriorityTier.choices, default=PriorityTier.RESERVED)
    priority = models.IntegerField(default=0, help_text="Higher is preempted later")
    state = models.CharField(
        max_length=16, choices=ReservationState.choices, default=ReservationState.REQUESTED, db_index=True
    )
    note = models.TextField(blank=True)
    client_id = models.CharField(
        max_length=128, null=True, blank=True, help_text="The sender's id: a repeated create is a no-op"
    )
    # Whose ids client_id is among, set by the server: "site:<id>" for an agent token (a site's
    # scheduler), "user:<id>" for a person. Another sender's id is out of reach, never squatted.
    client_scope = models.CharField(max_length=64, blank=True, default="", editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_via = models.CharField(max_length=100, blank=True, help_text="Who asked: a user or an agent token")
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        ordering = ["start", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gt=0), name="reservation_gpus_positive"),
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="reservation_end_after_start"),
            models.UniqueConstraint(
                fields=["client_scope", "client_id"],
                condition=Q(client_id__isnull=False),
                name="reservation_client_id_unique_in_scope",
            ),
            models.CheckConstraint(condition=~Q(client_id=""), name="reservation_client_id_not_blank"),
        ]
        indexes = [models.Index(fields=["pool", "state", "start", "end"], name="reservation_pool_window")]

    def __str__(self) -> str:
        return f"{self.team}: {self.gpus} x {self.pool} {self.start:%Y-%m-%d}..{self.end:%Y-%m-%d}"

    @property
    def duration(self) -> timedelta:
        return self.end - self.start
