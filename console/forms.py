"""Forms of the console's own pages."""

from __future__ import annotations

from django import forms

from console.models import PersonalToken


class PersonalTokenForm(forms.ModelForm):
    class Meta:
        model = PersonalToken
        fields = ["name"]
