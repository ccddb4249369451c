from __future__ import annotations

from django import forms

from fleet.telemetry.models import ScrapeTarget


class ScrapeTargetForm(forms.ModelForm):
    class Meta:
        model = ScrapeTarget
        fields = ["site", "name", "url", "kind", "interval_seconds", "timeout_seconds", "hostname", "endpoint_name"]
        labels = {"url": "URL", "interval_seconds": "Interval (s)", "timeout_seconds": "Timeout (s)"}
        widgets = {
            "url": forms.URLInput(attrs={"placeholder": "http://gpu-a-001:9400/metrics"}),
            "hostname": forms.TextInput(attrs={"placeholder": "only if the exporter has no hostname label"}),
            "endpoint_name": forms.TextInput(attrs={"placeholder": "default: the model label"}),
        }
