"""Forms of the console's own pages."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import password_validation
from django.contrib.auth.models import User
from django.contrib.auth.validators import UnicodeUsernameValidator

from console import people, roles
from console.models import PersonalToken


class PersonalTokenForm(forms.ModelForm):
    class Meta:
        model = PersonalToken
        fields = ["name"]


class PersonForm(forms.Form):
    """A new person with a role, in one step. A blank password is generated and shown once."""

    username = forms.CharField(max_length=150, validators=[UnicodeUsernameValidator()])
    email = forms.EmailField(required=False)
    role = forms.ChoiceField(choices=[(r, r) for r in people.ROLE_CHOICES], initial=roles.VIEWER)
    password = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="Leave blank to generate one, shown once.",
    )

    def clean_username(self) -> str:
        username = self.cleaned_data["username"]
        if User.objects.filter(username__iexact=username).exists():
            raise forms.ValidationError("Is taken.")
        return username

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        password = cleaned.get("password")
        if password:
            probe = User(username=cleaned.get("username", ""), email=cleaned.get("email", ""))
            try:
                password_validation.validate_password(password, probe)
            except forms.ValidationError as exc:
                self.add_error("password", exc)
        return cleaned


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=[(r, r) for r in people.ROLE_CHOICES])
