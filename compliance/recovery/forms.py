"""The recovery page's forms: a register item (RPO and RTO in hours, blank for the class's
default) and a restore test. Errors go on the field they concern; the views write nothing unless
the form is valid."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.utils import timezone

from compliance.choices import RecoveryKind, RecoveryState
from compliance.models import RECOVERY_DEFAULTS, BackupReport, RecoveryItem
from compliance.services import recovery
from console.timebounds import BoundedDatesFormMixin

_MOMENT = forms.DateTimeInput(attrs={"type": "datetime-local", "step": 60}, format="%Y-%m-%dT%H:%M")
MAX_HOURS = 24 * 366  # a year: an RPO or RTO past that is a typo, not a target


def _hours(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:g} h" if hours >= 1 else f"{hours * 60:g} min"


def defaults_text() -> str:
    """The class defaults, in words: "Dataset: RPO 24 h, RTO 8 h; …"."""
    return "; ".join(
        f"{RecoveryKind(kind).label}: RPO {_hours(rpo)}, RTO {_hours(rto)}"
        for kind, (rpo, rto) in RECOVERY_DEFAULTS.items()
    )


class RecoveryItemForm(forms.ModelForm):
    """An item of the register. RPO and RTO are entered in hours (0.5 = 30 minutes); left blank,
    the item takes its class's default (RECOVERY_DEFAULTS), also after a change of class."""

    rpo_hours = forms.FloatField(
        label="RPO (hours)", required=False, min_value=0.01, max_value=MAX_HOURS, help_text="Blank: the class default"
    )
    rto_hours = forms.FloatField(
        label="RTO (hours)", required=False, min_value=0.01, max_value=MAX_HOURS, help_text="Blank: the class default"
    )
    restore_test_every_days = forms.IntegerField(
        label="Restore test every (days)", min_value=1, max_value=3660, initial=92
    )

    class Meta:
        model = RecoveryItem
        fields = [
            "kind",
            "name",
            "dataset",
            "job",
            "cluster",
            "source_site",
            "source_tier",
            "location",
            "method",
            "copy_site",
            "copy_tier",
            "schedule",
            "notes",
        ]
        widgets = {"notes": forms.Textarea(attrs={"rows": 2})}
        labels = {"kind": "Class", "dataset": "Compliance register dataset", "job": "Training job"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["job"].queryset = self.fields["job"].queryset.order_by("-pk")  # type: ignore[attr-defined]
        item = self.instance
        if item.pk:
            self.fields["rpo_hours"].initial = round(item.rpo.total_seconds() / 3600, 2)
            self.fields["rto_hours"].initial = round(item.rto.total_seconds() / 3600, 2)
            self.fields["restore_test_every_days"].initial = item.restore_test_every.days
        else:
            self.fields["restore_test_every_days"].initial = item.restore_test_every.days

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        kind = data.get("kind")
        if data.get("dataset") is not None and kind not in (None, RecoveryKind.DATASET):
            self.add_error("dataset", "Only a dataset item names a dataset of the compliance register.")
        if (data.get("job") is not None or data.get("cluster")) and kind not in (None, RecoveryKind.CHECKPOINTS):
            field = "job" if data.get("job") is not None else "cluster"
            self.add_error(field, "Only checkpoints name a job or cluster.")
        return data

    def save(self, commit: bool = True) -> RecoveryItem:
        item: RecoveryItem = super().save(commit=False)
        rpo, rto = self.cleaned_data.get("rpo_hours"), self.cleaned_data.get("rto_hours")
        item.rpo = None if rpo is None else timedelta(hours=rpo)  # type: ignore[assignment]
        item.rto = None if rto is None else timedelta(hours=rto)  # type: ignore[assignment]
        item.restore_test_every = timedelta(days=self.cleaned_data["restore_test_every_days"])
        if commit:
            item.save()
        return item


class RestoreTestForm(BoundedDatesFormMixin, forms.Form):
    """A restore test entered by hand; who entered it is the signed-in user."""

    item = forms.ModelChoiceField(queryset=RecoveryItem.objects.order_by("name"))
    backup = forms.CharField(max_length=200, required=False, label="From backup (run id)", help_text="Blank: not said")
    into = forms.CharField(max_length=500, label="Restored into", help_text="A scratch cluster, a database, a path")
    started = forms.DateTimeField(widget=_MOMENT)
    finished = forms.DateTimeField(widget=_MOMENT)
    verified = forms.BooleanField(required=False, label="The restored copy was verified")
    verification = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="How: row counts, checksums, a model that loads; and what was found",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        started, finished = data.get("started"), data.get("finished")
        if started and finished:
            if finished < started:
                self.add_error("finished", "Is before started.")
            elif finished > timezone.now() + recovery.CLOCK_SKEW:
                self.add_error("finished", "Is in the future: record a test that has ended.")
        if data.get("verified") and not (data.get("verification") or "").strip():
            self.add_error("verification", "Say how the copy was verified.")
        item, run = data.get("item"), (data.get("backup") or "").strip()
        data["backup_report"] = None
        if item is not None and run:
            report = BackupReport.objects.filter(item=item, external_id=run).first()
            if report is None:
                self.add_error("backup", f"{item.name} has no backup run {run!r}.")
            data["backup_report"] = report
        return data


class RegisterFilterForm(forms.Form):
    """The page's filters (GET): by state and by class."""

    state = forms.ChoiceField(choices=[("", "Every state"), *RecoveryState.choices], required=False)
    kind = forms.ChoiceField(choices=[("", "Every class"), *RecoveryKind.choices], required=False, label="Class")
