"""The register's page forms: a model version, a dataset, a lineage link and a crawler CSV.
Each puts its errors on the field they concern; the views write nothing unless a form is valid."""

from __future__ import annotations

from typing import Any

from django import forms

from compliance.choices import Modality
from compliance.models.register import Dataset, GpaiModel
from compliance.services.register import MAX_CSV_BYTES, scratch_error
from console.timebounds import BoundedDatesFormMixin
from fleet.models import Job

_DATE = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
_SHORT_TEXT = forms.Textarea(attrs={"rows": 2})
CONTENT_TYPE_FIELDS = tuple(f"content_types_{m}" for m in Modality.values)
SOURCE_COMMENT_FIELDS = (
    "comments_public",
    "comments_third_party",
    "comments_crawled",
    "comments_user_data",
    "comments_synthetic",
    "comments_other_sources",
)


class GpaiModelForm(BoundedDatesFormMixin, forms.ModelForm):
    modalities = forms.MultipleChoiceField(
        choices=Modality.choices, required=False, widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = GpaiModel
        fields = [
            "name",
            "version",
            "provider_name",
            "provider_contact",
            "provider_established_in_union",
            "authorised_representative",
            "trained_from_scratch",
            "base_model",
            "base_model_external",
            "placed_on_market",
            "modalities",
            "other_modality",
            *CONTENT_TYPE_FIELDS,
            "continuously_trained",
            "linguistic_characteristics",
            "other_characteristics",
            "comments_general",
            "training_compute_flop",
            "weights_location",
            "weights_classification",
            "export_control_notes",
            "export_control_checked_on",
            "signed_code_of_practice",
            "tdm_opt_out_measures",
            "comments_tdm",
            "illegal_content_measures",
            "other_processing",
            *SOURCE_COMMENT_FIELDS,
        ]
        labels = {
            "provider_established_in_union": "Provider established in the Union (no authorised representative)",
            "trained_from_scratch": "Trained from scratch (no model dependencies)",
            "continuously_trained": "Trained on new data after the latest collection date",
            "content_types_text": "Types of content: text",
            "content_types_image": "Types of content: image",
            "content_types_audio": "Types of content: audio",
            "content_types_video": "Types of content: video",
            "content_types_other": "Types of content: other",
            "comments_general": "Additional comments (1.3)",
            "comments_public": "Additional comments (2.1)",
            "comments_third_party": "Additional comments (2.2.2)",
            "comments_crawled": "Additional comments (2.3)",
            "comments_user_data": "Additional comments (2.4)",
            "comments_synthetic": "Additional comments (2.5)",
            "comments_other_sources": "Additional comments (2.6)",
            "comments_tdm": "Additional comments (3.1)",
            "training_compute_flop": "Training compute (FLOP)",
            "placed_on_market": "Placed on the EU market",
            "export_control_checked_on": "Export control checked on",
            "signed_code_of_practice": "Signed the GPAI Code of Practice",
            "tdm_opt_out_measures": "TDM opt-out measures (3.1)",
            "illegal_content_measures": "Illegal-content measures (3.2)",
            "other_processing": "Other processing information (3.3)",
        }
        widgets = {
            "placed_on_market": _DATE,
            "export_control_checked_on": _DATE,
            "training_compute_flop": forms.NumberInput(attrs={"placeholder": "e.g. 3e24", "step": "any"}),
            **{name: _SHORT_TEXT for name in (*CONTENT_TYPE_FIELDS, *SOURCE_COMMENT_FIELDS, "comments_general")},
            "comments_tdm": _SHORT_TEXT,
            "linguistic_characteristics": _SHORT_TEXT,
            "other_characteristics": _SHORT_TEXT,
            "export_control_notes": _SHORT_TEXT,
            "tdm_opt_out_measures": _SHORT_TEXT,
            "illegal_content_measures": _SHORT_TEXT,
            "other_processing": _SHORT_TEXT,
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        others = GpaiModel.objects.all()
        if self.instance.pk:
            others = others.exclude(pk=self.instance.pk)
        self.fields["base_model"].queryset = others
        # 3e24 is how FLOP are written; the decimal field takes it and stores the whole number.
        self.fields["training_compute_flop"].widget = forms.TextInput(attrs={"placeholder": "e.g. 3e24"})

    def clean(self) -> dict[str, Any]:
        """A model trained from scratch names no base model (the database's check, on the field)."""
        cleaned = super().clean()
        error = scratch_error(
            cleaned.get("trained_from_scratch"), cleaned.get("base_model"), cleaned.get("base_model_external", "")
        )
        if error:
            self.add_error("trained_from_scratch", error)
        return cleaned


class DatasetForm(forms.ModelForm):
    class Meta:
        model = Dataset
        fields = [
            "name",
            "source_category",
            "modality",
            "size",
            "size_unit",
            "description",
            "licence",
            "publicly_known",
            "personal_data",
            "special_categories",
            "lawful_basis",
            "tdm_opt_outs",
            "collected_until",
            "crawler_names",
            "crawl_purpose",
            "crawler_behaviour",
            "crawl_started",
            "crawl_ended",
            "user_data_origin",
            "user_data_source",
            "generated_by",
            "generated_by_other",
        ]
        labels = {
            "tdm_opt_outs": "TDM opt-outs honoured",
            "special_categories": "Special categories (Art. 9)",
            "publicly_known": "Publicly known (2.2.2: listed by name)",
            "user_data_origin": "User data from (2.4)",
            "user_data_source": "Services or products the user data came from",
            "generated_by": "Generated by models on the market (2.5)",
            "generated_by_other": "Generated by other models, incl. own not on the market (2.5)",
        }
        widgets = {
            "collected_until": _DATE,
            "crawl_started": _DATE,
            "crawl_ended": _DATE,
            "description": _SHORT_TEXT,
            "tdm_opt_outs": _SHORT_TEXT,
            "crawl_purpose": _SHORT_TEXT,
            "crawler_behaviour": _SHORT_TEXT,
        }

    def clean(self) -> dict[str, Any]:
        """The database's checks, as errors on the fields (a size needs its unit, a crawl ends
        after it starts) rather than a non-field error or an IntegrityError."""
        cleaned = super().clean()
        size, unit = cleaned.get("size"), cleaned.get("size_unit")
        if size is not None and not unit and "size_unit" not in self.errors:
            self.add_error("size_unit", "A size needs its unit.")
        if unit and size is None and "size" not in self.errors:
            self.add_error("size", "A unit needs a size.")
        started, ended = cleaned.get("crawl_started"), cleaned.get("crawl_ended")
        if started and ended and ended < started:
            self.add_error("crawl_ended", "Must not be before the crawl started.")
        return cleaned


class LineageForm(BoundedDatesFormMixin, forms.Form):
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.all())
    job = forms.ModelChoiceField(
        queryset=Job.objects.order_by("-created_at"), required=False, empty_label="(no job recorded)"
    )


class DomainCsvForm(forms.Form):
    """The file only; the view imports it and puts a bad line's error on ``file``."""

    file = forms.FileField(
        label="Crawler CSV (domain,bytes)", widget=forms.ClearableFileInput(attrs={"accept": ".csv,text/csv"})
    )

    def clean_file(self) -> str:
        """The file's text (UTF-8)."""
        upload = self.cleaned_data["file"]
        if upload.size > MAX_CSV_BYTES:
            raise forms.ValidationError(f"Larger than {MAX_CSV_BYTES // 1024 // 1024} MiB.")
        try:
            return upload.read().decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise forms.ValidationError(f"Not UTF-8 text: {exc}.") from None
