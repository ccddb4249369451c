"""The register: general-purpose models, the datasets they were trained on, and the lineage
between training jobs, datasets and model versions.

Every question the AI Office template asks is answerable here, and blank means "not answered
yet": the summary shows such an answer as "to be provided", never a guess. Where the template
allows "not applicable", the register holds the fact that makes it so (the provider is
established in the Union, the model was trained from scratch, a modality is not used) rather
than a free-text "N/A".
"""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from compliance.choices import (
    LawfulBasis,
    Modality,
    SizeUnit,
    SourceCategory,
    UserDataOrigin,
    WeightsClassification,
)

# Art. 51(2): a general-purpose model is presumed to have systemic risk above 10^25 training FLOP.
SYSTEMIC_RISK_FLOP = Decimal("1e25")


class GpaiModel(models.Model):
    """One version of a general-purpose AI model placed (or to be placed) on the EU market."""

    name = models.CharField(max_length=200)
    version = models.CharField(max_length=64)
    # 1.1 provider
    provider_name = models.CharField(max_length=200, blank=True)
    provider_contact = models.CharField(max_length=300, blank=True)
    provider_established_in_union = models.BooleanField(
        null=True, blank=True, help_text="Established in the Union: no authorised representative (Art. 54)"
    )
    authorised_representative = models.CharField(max_length=300, blank=True)
    # 1.2 model
    trained_from_scratch = models.BooleanField(
        null=True, blank=True, help_text="Not a modification or fine-tune of another model: no model dependencies"
    )
    base_model = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="derived",
        help_text="The registered model this one was fine-tuned from",
    )
    base_model_external = models.CharField(
        max_length=200, blank=True, help_text="A base model from another provider (name and version)"
    )
    placed_on_market = models.DateField(null=True, blank=True, help_text="Date placed on the Union market")
    modalities = ArrayField(models.CharField(max_length=8, choices=Modality.choices), default=list, blank=True)
    # 1.3 characteristics the datasets cannot give: the types of content per modality
    content_types_text = models.TextField(blank=True, help_text="Types of content of the text")
    content_types_image = models.TextField(blank=True, help_text="Types of content of the images")
    content_types_audio = models.TextField(blank=True, help_text="Types of content of the audio")
    content_types_video = models.TextField(blank=True, help_text="Types of content of the video")
    content_types_other = models.TextField(blank=True, help_text="Types of content of the other modality")
    other_modality = models.CharField(max_length=200, blank=True, help_text='What the "other" modality is')
    continuously_trained = models.BooleanField(
        null=True, blank=True, help_text="Trained on new data after the latest date of data collection"
    )
    linguistic_characteristics = models.TextField(blank=True)
    other_characteristics = models.TextField(blank=True)
    # Art. 51 / 55
    training_compute_flop = models.DecimalField(
        max_digits=40, decimal_places=0, null=True, blank=True, validators=[MinValueValidator(0)]
    )
    # weights: a trade secret with export-control duties that change and must be checked
    weights_location = models.CharField(max_length=300, blank=True)
    weights_classification = models.CharField(
        max_length=16, choices=WeightsClassification.choices, default=WeightsClassification.CONFIDENTIAL
    )
    export_control_notes = models.TextField(blank=True)
    export_control_checked_on = models.DateField(null=True, blank=True)
    # 3. data processing
    signed_code_of_practice = models.BooleanField(null=True, blank=True)
    tdm_opt_out_measures = models.TextField(blank=True, help_text="3.1 How text-and-data-mining opt-outs are respected")
    illegal_content_measures = models.TextField(blank=True, help_text="3.2 Measures to remove illegal content")
    other_processing = models.TextField(blank=True, help_text="3.3 Other information")
    # "Additional comments (optional)" of the template's sections that have one
    comments_general = models.TextField(blank=True, help_text="1.3 Additional comments")
    comments_public = models.TextField(blank=True, help_text="2.1 Additional comments")
    comments_third_party = models.TextField(blank=True, help_text="2.2.2 Additional comments")
    comments_crawled = models.TextField(blank=True, help_text="2.3 Additional comments")
    comments_user_data = models.TextField(blank=True, help_text="2.4 Additional comments")
    comments_synthetic = models.TextField(blank=True, help_text="2.5 Additional comments")
    comments_other_sources = models.TextField(blank=True, help_text="2.6 Additional comments")
    comments_tdm = models.TextField(blank=True, help_text="3.1 Additional comments")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="gpaimodel_unique_version"),
            # A model trained from scratch has no base model: both answers cannot be true.
            models.CheckConstraint(
                condition=~Q(trained_from_scratch=True) | (Q(base_model__isnull=True) & Q(base_model_external="")),
                name="gpaimodel_scratch_has_no_base",
            ),
        ]
        verbose_name = "general-purpose model"

    def __str__(self) -> str:
        return f"{self.name} {self.version}"

    @property
    def systemic_risk(self) -> bool:
        return self.training_compute_flop is not None and self.training_compute_flop > SYSTEMIC_RISK_FLOP

    def export_control_due(self) -> date | None:
        if self.export_control_checked_on is None:
            return None
        return self.export_control_checked_on + timedelta(days=settings.EXPORT_CONTROL_REVIEW_DAYS)

    def export_control_overdue(self, today: date) -> bool:
        """Never checked, or checked longer ago than the review period."""
        due = self.export_control_due()
        return due is None or due < today


class Dataset(models.Model):
    name = models.CharField(max_length=200, unique=True)
    source_category = models.CharField(max_length=16, choices=SourceCategory.choices)
    modality = models.CharField(max_length=8, choices=Modality.choices)
    size = models.DecimalField(
        max_digits=24, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(0)]
    )
    size_unit = models.CharField(max_length=8, choices=SizeUnit.choices, blank=True)
    description = models.TextField(blank=True, help_text="Content description")
    # Internal: the register and the pack hold the licence, the public summary never does.
    licence = models.CharField(max_length=300, blank=True, help_text="Licence or terms of use")
    publicly_known = models.BooleanField(
        default=False, help_text="2.2.2: a private dataset whose name is publicly known, listed by name"
    )
    personal_data = models.BooleanField(null=True, blank=True)
    special_categories = models.CharField(max_length=300, blank=True, help_text="Art. 9 categories present, if any")
    lawful_basis = models.CharField(max_length=24, choices=LawfulBasis.choices, blank=True)
    tdm_opt_outs = models.TextField(blank=True, help_text="How text-and-data-mining opt-outs were honoured")
    collected_until = models.DateField(null=True, blank=True, help_text="Latest date of data collection")
    # 2.3 crawled data
    crawler_names = models.CharField(max_length=300, blank=True)
    crawl_purpose = models.TextField(blank=True)
    crawler_behaviour = models.TextField(blank=True, help_text="robots.txt, paywalls, captchas")
    crawl_started = models.DateField(null=True, blank=True)
    crawl_ended = models.DateField(null=True, blank=True)
    # 2.4 user data, 2.5 synthetic data
    user_data_origin = models.CharField(
        max_length=16,
        choices=UserDataOrigin.choices,
        blank=True,
        help_text="2.4: which of the two questions it answers",
    )
    user_data_source = models.CharField(
        max_length=300, blank=True, help_text="The services or products the user data was collected from"
    )
    generated_by = models.CharField(
        max_length=300, blank=True, help_text="General-purpose models on the market that generated synthetic data"
    )
    generated_by_other = models.CharField(
        max_length=300,
        blank=True,
        help_text="Other models that generated it, including the provider's own not on the market",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            # A size means nothing without its unit (and a unit alone says nothing).
            models.CheckConstraint(
                condition=Q(size__isnull=True, size_unit="") | (Q(size__isnull=False) & ~Q(size_unit="")),
                name="dataset_size_has_unit",
            ),
            models.CheckConstraint(
                condition=Q(crawl_started__isnull=True)
                | Q(crawl_ended__isnull=True)
                | Q(crawl_ended__gte=models.F("crawl_started")),
                name="dataset_crawl_period_ordered",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class CrawledDomain(models.Model):
    """Bytes of content a crawled dataset holds from one domain (imported from the crawler's CSV)."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="domains")
    domain = models.CharField(max_length=253)
    bytes = models.BigIntegerField(validators=[MinValueValidator(0)])

    class Meta:
        ordering = ["-bytes", "domain"]
        constraints = [models.UniqueConstraint(fields=["dataset", "domain"], name="crawleddomain_unique")]

    def __str__(self) -> str:
        return f"{self.domain} ({self.bytes} B)"


class Lineage(models.Model):
    """A model version was trained on a dataset, by a training job when the console knows it."""

    model = models.ForeignKey(GpaiModel, on_delete=models.CASCADE, related_name="lineage")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="lineage")
    job = models.ForeignKey("fleet.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="lineage")
    recorded_at = models.DateTimeField(auto_now_add=True)
    recorded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["model", "dataset__name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "dataset", "job"], name="lineage_unique"),
            models.UniqueConstraint(
                fields=["model", "dataset"], condition=Q(job__isnull=True), name="lineage_unique_without_job"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dataset} → {self.model}"
