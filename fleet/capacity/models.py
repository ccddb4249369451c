"""Capacity: GPU pools per site and model, the supply that lands on them (procurement orders, grid
approvals), teams and their quotas (Kueue's nominal quota, borrowing and lending limits; a pool is
a cohort) and reservations.

The figures (installed, energised, healthy, reserved) are computed by fleet.capacity.read.supply,
never stored: they follow the inventory, the rack budgets and the open incidents as they change.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

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


class OrderApproval(models.TextChoices):
    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"


class ReservationState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    ACTIVE = "active", "Active"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"
    # Taken back by a team reclaiming its nominal quota (Kueue's reclaimWithinCohort): holds nothing.
    PREEMPTED = "preempted", "Preempted"


class ReclaimPolicy(models.TextChoices):
    """Kueue's ``preemption.reclaimWithinCohort``: whether a team asking for GPUs inside its nominal
    quota that other teams borrow may preempt their borrowing reservations."""

    NEVER = "Never", "Never"
    LOWER_PRIORITY = "LowerPriority", "Lower priority only"
    ANY = "Any", "Any borrowing reservation"


# Reservations that hold capacity: approved (not started yet) and active (running now).
COMMITTED_STATES = (ReservationState.APPROVED, ReservationState.ACTIVE)


class Pool(models.Model):
    """The GPUs of one model at one site, counted as a whole (``gpu_model`` is the Gpu.model name)."""

    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="pools")
    gpu_model = models.CharField(max_length=64, help_text="The Gpu.model it counts, e.g. NVIDIA H100 80GB HBM3")
    name = models.CharField(max_length=100)
    reclaim_within_cohort = models.CharField(
        max_length=16,
        choices=ReclaimPolicy.choices,
        default=ReclaimPolicy.NEVER,
        help_text="Kueue's reclaimWithinCohort: may a team take back its nominal quota from borrowers?",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "gpu_model"], name="pool_unique_model_per_site")]
        # fleet.approve_capacity: approve others' orders and power approvals, change team quotas.
        permissions = [("approve_capacity", "Can approve orders and power approvals and change team quotas")]

    def __str__(self) -> str:
        return f"{self.site.name}/{self.name}"


class ProcurementOrder(models.Model):
    """GPUs bought for a pool. Approved and undelivered, they count as future supply from the
    promised date, unless late (promised date past): a late order counts nowhere until it is
    delivered. A requested or rejected order counts nowhere.

    ``approval_status`` defaults to approved for code that creates orders directly (the simulator,
    data imports, tests): the doors people use (API, admin) create them requested, and
    fleet.capacity.actions.approvals approves them."""

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="orders")
    count = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    ordered_on = models.DateField()
    promised_on = models.DateField(help_text="Promised delivery date")
    delivered_on = models.DateField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=OrderStatus.choices, default=OrderStatus.ORDERED)
    vendor = models.CharField(max_length=100, blank=True)
    reference = models.CharField(max_length=100, blank=True)
    approval_status = models.CharField(max_length=16, choices=OrderApproval.choices, default=OrderApproval.APPROVED)
    # Who asked and who approved (fleet.capacity.actions.approvals records them).
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    self_approved = models.BooleanField(default=False, help_text="Approved by its own requester (an Admin)")
    # Who rejected it, while it is rejected (an approval clears them; the audit log keeps the history).
    rejected_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rejected_at = models.DateTimeField(null=True, blank=True)
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
    # Who asked and who approved (fleet.capacity.actions.approvals records them).
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    self_approved = models.BooleanField(default=False, help_text="Approved by its own requester (an Admin)")
    # Who rejected it, while it is rejected (an approval clears them; the audit log keeps the history).
    rejected_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rejected_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["expected_on", "pk"]
        constraints = [models.CheckConstraint(condition=Q(added_kw__gt=0), name="approval_added_kw_positive")]

    def __str__(self) -> str:
        return f"+{self.added_kw} kW at {self.site} ({self.reference or self.pk})"


class Team(models.Model):
    """A team that holds quotas and requests reservations (Kueue: the owner of a ClusterQueue).
    Quotas and reservations refer to it by name (``to_field``), so the API keeps naming teams."""

    name = models.CharField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="teams")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TeamQuota(models.Model):
    """Kueue's ClusterQueue quota for a team on a pool (the pool is the cohort). The team may hold
    up to nominal + borrowing limit GPUs (no limit: as much as the cohort lends), the borrowed part
    only out of what the other teams lend of their unused nominal quota; a lending limit caps what
    others may borrow of this team's nominal quota (no limit: all of it). fleet.capacity.quotas."""

    # By name (to_field): the column keeps the team's name, as before teams were records.
    team = models.ForeignKey(Team, to_field="name", db_column="team", on_delete=models.PROTECT, related_name="quotas")
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="quotas")
    nominal_gpus = models.PositiveIntegerField()
    borrowing_limit_gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="Kueue's borrowingLimit; empty: no limit within the pool"
    )
    lending_limit_gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="Kueue's lendingLimit; empty: all of its unused nominal quota may be lent"
    )

    class Meta:
        ordering = ["pool", "team"]
        constraints = [
            models.UniqueConstraint(fields=["team", "pool"], name="quota_unique_team_per_pool"),
            # Kueue: a lendingLimit above the nominal quota is invalid.
            models.CheckConstraint(
                condition=Q(lending_limit_gpus__isnull=True) | Q(lending_limit_gpus__lte=F("nominal_gpus")),
                name="quota_lending_within_nominal",
            ),
        ]

    def __str__(self) -> str:
        limit = "any" if self.borrowing_limit_gpus is None else self.borrowing_limit_gpus
        return f"{self.team_id} on {self.pool}: {self.nominal_gpus} (+{limit})"


class ReservationQuerySet(models.QuerySet["Reservation"]):
    def committed(self) -> ReservationQuerySet:
        """Approved or active: what holds capacity."""
        return self.filter(state__in=COMMITTED_STATES)

    def overlapping(self, start: object, end: object) -> ReservationQuerySet:
        """Reservations whose [start, end) meets [start, end)."""
        return self.filter(start__lt=end, end__gt=start)


class Reservation(models.Model):
    team = models.ForeignKey(
        Team, to_field="name", db_column="team", on_delete=models.PROTECT, related_name="reservations"
    )
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
    preempted_at = models.DateTimeField(null=True, blank=True)
    preempted_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", help_text="The reclaiming request"
    )
    preempted_reason = models.TextField(blank=True)
    self_approved = models.BooleanField(default=False, help_text="Approved by its own requester (an Admin)")
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
        return f"{self.team_id}: {self.gpus} x {self.pool} {self.start:%Y-%m-%d}..{self.end:%Y-%m-%d}"

    @property
    def requested_by(self) -> Any:
        """The person who asked (None for an agent token's request: ``requested_via`` names it)."""
        return self.created_by

    @property
    def requested_by_id(self) -> int | None:
        return self.created_by_id

    @property
    def duration(self) -> timedelta:
        return self.end - self.start
