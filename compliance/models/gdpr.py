"""GDPR: records of processing (Art. 30(1) as controller, Art. 30(2) as processor) and the log of
data-subject requests (Arts. 15-22) with their Art. 12(3) deadlines."""

from __future__ import annotations

import calendar
from datetime import date

from django.db import models
from django.db.models import F, Q

from compliance.choices import OPEN_REQUEST_STATES, DataClass, LawfulBasis, RequestKind, RequestStatus

# Art. 12(3): a further two months where necessary, told to the data subject within the first.
EXTENSION_MONTHS = 2
# Not answered (yet, or ever): open ones, and those closed by their correction.
UNANSWERED_STATES = (*OPEN_REQUEST_STATES, RequestStatus.CORRECTED)


def months_after(day: date, months: int) -> date:
    """The same day ``months`` later, or that month's last day when it is shorter (31 January + 1
    month is 28 or 29 February)."""
    index = day.month - 1 + months
    y, m = day.year + index // 12, index % 12 + 1
    return date(y, m, min(day.day, calendar.monthrange(y, m)[1]))


def one_month_after(day: date) -> date:
    """Art. 12(3): "within one month of receipt": the same day next month, or the month's last
    day when the next month is shorter (31 January -> 28 or 29 February)."""
    return months_after(day, 1)


def due_date(received_on: date, *, extended: bool) -> date:
    """When the answer is due: one month after receipt; with an extension, two further months
    counted from that first due date (31 January -> 28 February -> 28 April), the earlier of the
    readings an auditor might take."""
    first = one_month_after(received_on)
    return months_after(first, EXTENSION_MONTHS) if extended else first


def received_on_error(day: date, today: date) -> str | None:
    """Why a request's date of receipt cannot be taken: a request is logged once it has arrived."""
    if day > today:
        return "A request cannot be received in the future."
    return None


# A record of processing as the register, its API, its form and the pack show it: the Art. 30(1)
# fields with the lawful basis (and its balancing note), in this order.
RECORD_FIELDS = (
    "name",
    "data_class",
    "controller",
    "joint_controller",
    "representative",
    "data_protection_officer",
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

# A processor's record (Art. 30(2)), in the order the article lists its points.
PROCESSOR_FIELDS = (
    "name",
    "processor",
    "controllers",
    "representative",
    "data_protection_officer",
    "processing_categories",
    "third_country_transfers",
    "security_measures",
)


class DataAsset(models.Model):
    """One record of processing as controller: a data asset with the Art. 30(1) fields."""

    name = models.CharField(max_length=200, unique=True)
    data_class = models.CharField(max_length=24, choices=DataClass.choices)
    # Art. 30(1)(a): each its own answer, so "no joint controller" and "not told" are not one blank.
    controller = models.CharField(max_length=300, help_text="Name and contact details of the controller")
    joint_controller = models.CharField(
        max_length=300, blank=True, help_text="Name and contact details of any joint controller (Art. 26)"
    )
    representative = models.CharField(
        max_length=300,
        blank=True,
        help_text="The controller's representative in the Union, where one is required (Art. 27)",
    )
    data_protection_officer = models.CharField(
        max_length=300, blank=True, help_text="Name and contact details of the data protection officer"
    )
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


class ProcessorRecord(models.Model):
    """A record of the processing the platform carries out as a processor for another controller
    (Art. 30(2)): a customer's training data on the fleet, for example."""

    name = models.CharField(max_length=200, unique=True, help_text="The processing activity")
    processor = models.CharField(max_length=300, help_text="Name and contact details of the processor")
    controllers = models.TextField(
        help_text="Name and contact details of each controller on whose behalf the processor acts"
    )
    representative = models.CharField(
        max_length=300, blank=True, help_text="The processor's or the controller's representative, where applicable"
    )
    data_protection_officer = models.CharField(
        max_length=300, blank=True, help_text="Name and contact details of the data protection officer"
    )
    processing_categories = models.TextField(help_text="Categories of processing carried out for each controller")
    third_country_transfers = models.TextField(
        blank=True, help_text="Transfers to a third country or international organisation, and their safeguards"
    )
    security_measures = models.TextField(blank=True, help_text="Technical and organisational measures (Art. 32(1))")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "processor record"
        verbose_name_plural = "processor records"

    def __str__(self) -> str:
        return self.name


class SubjectRequestQuerySet(models.QuerySet["SubjectRequest"]):
    def open(self) -> SubjectRequestQuerySet:
        return self.filter(status__in=OPEN_REQUEST_STATES)

    def overdue(self, today: date) -> SubjectRequestQuerySet:
        """Still open after the due date (SubjectRequest.is_overdue, row by row)."""
        return self.open().filter(due_on__lt=today)

    def late(self) -> SubjectRequestQuerySet:
        """Completed or refused after the due date (SubjectRequest.is_late, row by row). One closed
        by its correction was not answered: its correction, due no later, carries it on."""
        return self.exclude(status__in=UNANSWERED_STATES).filter(closed_on__gt=F("due_on"))

    def of_period(self, start: date, end: date) -> SubjectRequestQuerySet:
        """Every request that was before the controller at some time from ``start`` to ``end``
        (both included): received by the end, and open at its start or closed on or after it."""
        return self.filter(received_on__lte=end).filter(Q(closed_on__isnull=True) | Q(closed_on__gte=start))


class SubjectRequest(models.Model):
    """A data-subject request (Arts. 15-22), due one month after receipt, or three with an
    extension the data subject was told of within the first month (Art. 12(3)).

    ``kind`` and ``received_on`` are fixed once logged: rewriting them would turn an overdue
    erasure into an access request in time. A mistake is corrected by a new request that
    ``corrects`` this one (compliance.services.gdpr.log_request), and both stay in the log.
    """

    kind = models.CharField(max_length=24, choices=RequestKind.choices)
    subject_reference = models.CharField(max_length=200, help_text="A pseudonymous reference, not the person's data")
    received_on = models.DateField()
    due_on = models.DateField(editable=False)
    extension_reason = models.TextField(blank=True, help_text="Why two further months are necessary")
    extension_notified_on = models.DateField(
        null=True, blank=True, help_text="When the data subject was told of the extension and its reasons"
    )
    status = models.CharField(max_length=16, choices=RequestStatus.choices, default=RequestStatus.OPEN)
    assets = models.ManyToManyField(DataAsset, blank=True, related_name="requests")
    closed_on = models.DateField(null=True, blank=True, help_text="When the request was answered or refused")
    notes = models.TextField(blank=True)
    corrects = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="corrected_by",
        help_text="The request this one corrects (its kind or date of receipt was wrong)",
    )
    correction_reason = models.TextField(blank=True, help_text="What was wrong with the request it corrects")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SubjectRequestQuerySet.as_manager()

    class Meta:
        ordering = ["due_on", "pk"]
        constraints = [
            # An extension is its reason and the date the data subject was told: both or neither.
            models.CheckConstraint(
                condition=Q(extension_reason="", extension_notified_on__isnull=True)
                | (~Q(extension_reason="") & Q(extension_notified_on__isnull=False)),
                name="subjectrequest_extension_complete",
            ),
            models.CheckConstraint(
                condition=Q(closed_on__isnull=True) | Q(closed_on__gte=F("received_on")),
                name="subjectrequest_closed_after_receipt",
            ),
            # A correction is the request it corrects and why: both or neither.
            models.CheckConstraint(
                condition=Q(corrects__isnull=True, correction_reason="")
                | (Q(corrects__isnull=False) & ~Q(correction_reason="")),
                name="subjectrequest_correction_complete",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.subject_reference}"

    def save(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.due_on = due_date(self.received_on, extended=self.extended)
        super().save(*args, **kwargs)

    @property
    def extended(self) -> bool:
        return self.extension_notified_on is not None

    def is_overdue(self, today: date) -> bool:
        """Still open after its due date."""
        return self.status in OPEN_REQUEST_STATES and self.due_on < today

    def is_late(self) -> bool:
        """Answered (or refused) after its due date."""
        return self.status not in UNANSWERED_STATES and self.closed_on is not None and self.closed_on > self.due_on

    @property
    def correction(self) -> SubjectRequest | None:
        """The request that corrects this one, if any (the reverse of ``corrects``)."""
        try:
            return self.corrected_by  # type: ignore[no-any-return]
        except SubjectRequest.DoesNotExist:
            return None
