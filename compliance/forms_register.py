"""The register's page forms: a model version, a dataset, a lineage link and a crawler CSV.
Each puts its errors on the field they concern; the views write nothing unless a form is valid."""

from __future__ import annotations

from typing import Any

from django import forms

from compliance.choices import Modality
from compliance.models.register import Dataset, GpaiModel
from compliance.services.register import MAX_CSV_BYTES
from fleet.models import Job

_DATE = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
_SHORT_TEXT = forms.Textarea(attrs={"rows": 2})


class GpaiModelForm(forms.ModelForm):
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
            "authorised_representative",
            "base_model",
            "base_model_external",
            "placed_on_market",
            "modalities",
            "content_types",
            "linguistic_characteristics",
            "other_characteristics",
            "training_compute_flop",
            "weights_location",
            "weights_classification",
            "export_control_notes",
            "export_control_checked_on",
            "signed_code_of_practice",
            "tdm_opt_out_measures",
            "illegal_content_measures",
            "other_processing",
        ]
        labels = {
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
            "content_types": _SHORT_TEXT,
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
            "user_data_source",
            "generated_by",
        ]
        labels = {"tdm_opt_outs": "TDM opt-outs honoured", "special_categories": "Special categories (Art. 9)"}
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


class LineageForm(forms.Form):
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
