"""The recovery register: what must survive the loss of a site or a storage tier, the backups
that report in for it, and the restore tests that prove a copy comes back (issue 26, "Recovery").

An item's RPO (how old a restored copy may be) and RTO (how long bringing it back may take) default
by kind (RECOVERY_DEFAULTS); the findings in compliance.detectors judge them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from compliance.choices import BackupMethod, BackupOutcome, RecoveryKind

# kind -> (RPO, RTO). Training data and checkpoints: hours; serving weights: minutes (an endpoint
# without them serves nothing); the console's own database: a working day's afternoon.
RECOVERY_DEFAULTS: dict[str, tuple[timedelta, timedelta]] = {
    RecoveryKind.DATASET: (timedelta(hours=24), timedelta(hours=8)),
    RecoveryKind.CHECKPOINTS: (timedelta(hours=24), timedelta(hours=8)),
    RecoveryKind.MODEL_WEIGHTS: (timedelta(hours=24), timedelta(minutes=30)),
    RecoveryKind.CONSOLE_DATABASE: (timedelta(hours=24), timedelta(hours=4)),
}


def default_restore_test_every() -> timedelta:
    """GOODPUT_RECOVERY_RESTORE_TEST_EVERY_DAYS (default 92: a quarter)."""
    return timedelta(days=settings.RECOVERY_RESTORE_TEST_EVERY_DAYS)


class RecoveryItem(models.Model):
    """One thing that must come back: a dataset, a job's or cluster's checkpoints, model weights,
    or the console's own database."""

    kind = models.CharField(max_length=24, choices=RecoveryKind.choices)
    name = models.CharField(max_length=200, unique=True, help_text="What backup jobs call it when they report in")
    dataset = models.ForeignKey(
        "compliance.Dataset",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="recovery_items",
        help_text="The compliance register's record of this dataset, where there is one",
    )
    source_site = models.ForeignKey(
        "fleet.Site", null=True, blank=True, on_delete=models.PROTECT, related_name="recovery_items"
    )
    source_tier = models.CharField(max_length=64, blank=True, help_text="e.g. nfs, object-store, local-nvme")
    job = models.ForeignKey(
        "fleet.Job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="recovery_items",
        help_text="Checkpoints: the training job that writes them",
    )
    cluster = models.CharField(
        max_length=100, blank=True, help_text="Checkpoints: the cluster whose jobs write them (the scheduler's name)"
    )
    location = models.CharField(max_length=500, blank=True, help_text="Where it is written (a path, a bucket)")
    rpo = models.DurationField(blank=True, help_text="Recovery point objective; blank: the kind's default")
    rto = models.DurationField(blank=True, help_text="Recovery time objective; blank: the kind's default")
    method = models.CharField(max_length=32, choices=BackupMethod.choices)
    # Where the copy is meant to live: shown until a backup reports its own copy location, and
    # given to the reports mapped from a scrape (Velero's metrics do not say where the copy is).
    copy_site = models.ForeignKey(
        "fleet.Site", null=True, blank=True, on_delete=models.PROTECT, related_name="recovery_item_copies"
    )
    copy_tier = models.CharField(max_length=64, blank=True)
    schedule = models.CharField(
        max_length=100,
        blank=True,
        db_index=True,
        help_text="The backup schedule's name in the exporter's metrics (Velero's `schedule` label)",
    )
    restore_test_every = models.DurationField(
        default=default_restore_test_every, help_text="A verified restore test at least this recent proves the RTO"
    )
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["kind", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Fill a blank RPO or RTO from the kind's defaults."""
        rpo, rto = RECOVERY_DEFAULTS[self.kind]
        if self.rpo is None:
            self.rpo = rpo
        if self.rto is None:
            self.rto = rto
        super().save(*args, **kwargs)


class BackupReport(models.Model):
    """One backup or replication run's result, as the job reported it. ``external_id`` (the job's
    run id) makes a repeated report the same record."""

    item = models.ForeignKey(RecoveryItem, on_delete=models.CASCADE, related_name="backups")
    external_id = models.CharField(max_length=200)
    started = models.DateTimeField()
    finished = models.DateTimeField()
    bytes = models.BigIntegerField(null=True, blank=True, validators=[MinValueValidator(0)])
    outcome = models.CharField(max_length=16, choices=BackupOutcome.choices)
    copy_site = models.ForeignKey(
        "fleet.Site", null=True, blank=True, on_delete=models.PROTECT, related_name="recovery_copies"
    )
    copy_tier = models.CharField(max_length=64, blank=True)
    received_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-finished"]
        constraints = [
            models.UniqueConstraint(fields=["item", "external_id"], name="recovery_backup_once_per_run"),
        ]
        indexes = [models.Index(fields=["item", "-finished"], name="recovery_backup_latest")]

    def __str__(self) -> str:
        return f"{self.item.name} {self.external_id}: {self.outcome}"


class RestoreTest(models.Model):
    """A restore that was tried: who, what from which backup, into where, how long, and whether the
    restored copy was verified (row counts, checksums, a model that loads)."""

    item = models.ForeignKey(RecoveryItem, on_delete=models.CASCADE, related_name="restore_tests")
    backup = models.ForeignKey(
        BackupReport, null=True, blank=True, on_delete=models.SET_NULL, related_name="restore_tests"
    )
    by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    by_name = models.CharField(max_length=200, blank=True, help_text="Who restored it, where not a console user")
    into = models.CharField(max_length=500, help_text="Where the copy was restored to")
    started = models.DateTimeField()
    finished = models.DateTimeField()
    verified = models.BooleanField(default=False)
    verification = models.TextField(blank=True, help_text="How it was verified, and what was found")
    # The caller's idempotency key (the API's ``key``, `manage.py restore`'s dump and target): a
    # retried submission is the same test. Blank for tests entered by hand.
    external_id = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-finished"]
        indexes = [models.Index(fields=["item", "-finished"], name="recovery_restore_latest")]
        constraints = [
            models.UniqueConstraint(
                fields=["item", "external_id"],
                condition=~models.Q(external_id=""),
                name="recovery_restore_once_per_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.item.name} restored into {self.into}"

    @property
    def duration(self) -> timedelta:
        return self.finished - self.started
