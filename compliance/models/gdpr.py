"""GDPR: records of processing (Art. 30) per data asset, and the log of data-subject requests."""

from __future__ import annotations

from datetime import date

from django.db import models
from django.db.models import Q

from compliance.choices import OPEN_REQUEST_STATES, DataClass, LawfulBasis, RequestKind, RequestStatus


def one_month_after(day: date) -> date:
    """Art. 12(3): "within one month of receipt": the same day next month, or the month's last
    day when the next month is shorter (31 January -> 28 or 29 February)."""
    import calendar

    y, m = (day.year + 1, 1) if day.month == 12 else (day.year, day.month + 1)
    return date(y, m, min(day.day, calendar.monthrange(y, m)[1]))


def received_on_error(day: date, today: date) -> str | None:
    """Why a request's date of receipt cannot be taken: a request is logged once it has arrived."""
    if day > today:
        return "A request cannot be received in the future."
    return None


# A record of processing as the register, its API, its form and the pack show it: the Art. 30
# fields with the lawful basis (and its balancing note), in this order.
RECORD_FIELDS = (
    "name",
    "data_class",
    "controller_contact",
    "purposes",
    "data_subject_categories",
    "personal_data_categories",
    "special_categories",
    "recipients",
    "third_country_transfers",
    "erasure_time_limit",
    "security_measures",
    "lawful_basis",
    "balancing_note",
)


class DataAsset(models.Model):
    """One record of processing: a data asset with the Art. 30 fields."""

    name = models.CharField(max_length=200, unique=True)
    data_class = models.CharField(max_length=24, choices=DataClass.choices)
    controller_contact = models.CharField(max_length=300)
    purposes = models.TextField()
    data_subject_categories = models.TextField(help_text="Categories of data subjects")
    personal_data_categories = models.TextField(help_text="Categories of personal data")
    special_categories = models.CharField(max_length=300, blank=True, help_text="Art. 9 categories, if any")
    recipients = models.TextField(blank=True)
    third_country_transfers = models.TextField(blank=True, help_text="Transfers to third countries and safeguards")
    erasure_time_limit = models.CharField(max_length=300, help_text="Time limits for erasure")
    security_measures = models.TextField()
    lawful_basis = models.CharField(max_length=24, choices=LawfulBasis.choices)
    balancing_note = models.TextField(blank=True, help_text="Legitimate-interests balancing test (Art. 6(1)(f))")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "record of processing"
        verbose_name_plural = "records of processing"
        constraints = [
            models.CheckConstraint(
                condition=~Q(lawful_basis=LawfulBasis.LEGITIMATE_INTERESTS) | ~Q(balancing_note=""),
                name="dataasset_legitimate_interests_balanced",
            )
        ]

    def __str__(self) -> str:
        return self.name


class SubjectRequestQuerySet(models.QuerySet["SubjectRequest"]):
    def open(self) -> SubjectRequestQuerySet:
        return self.filter(status__in=OPEN_REQUEST_STATES)

    def overdue(self, today: date) -> SubjectRequestQuerySet:
        return self.open().filter(due_on__lt=today)


class SubjectRequest(models.Model):
    """A data-subject request (access, erasure, objection), due one month after receipt."""

    kind = models.CharField(max_length=16, choices=RequestKind.choices)
    subject_reference = models.CharField(max_length=200, help_text="A pseudonymous reference, not the person's data")
    received_on = models.DateField()
    due_on = models.DateField(editable=False)
    status = models.CharField(max_length=16, choices=RequestStatus.choices, default=RequestStatus.OPEN)
    assets = models.ManyToManyField(DataAsset, blank=True, related_name="requests")
    closed_on = models.DateField(null=True, blank=True)
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SubjectRequestQuerySet.as_manager()

    class Meta:
        ordering = ["due_on", "pk"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.subject_reference}"

    def save(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.due_on = one_month_after(self.received_on)
        super().save(*args, **kwargs)

    def is_overdue(self, today: date) -> bool:
        return self.status in OPEN_REQUEST_STATES and self.due_on < today
