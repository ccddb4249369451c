from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.http import HttpRequest
from django.utils import timezone

from console.models import AgentToken, PersonalToken
from console.signals import row_changed

# django.contrib.auth registered its UserAdmin when imported above; ours replaces it.
admin.site.unregister(User)


@admin.register(User)
class PersonAdmin(UserAdmin):
    """People in the Django admin (issue 37, item 7): an Admin may not make anyone a superuser.

    ``is_superuser`` is shown and never edited: only ``manage.py createsuperuser`` makes one (the
    People page cannot either). A superuser's account is read-only to anyone who is not one, so
    an Admin cannot take it over by setting its password or e-mail instead.
    """

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*super().get_readonly_fields(request, obj), "is_superuser"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.is_superuser and not request.user.is_superuser:
            return False
        return super().has_change_permission(request, obj)


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "site", "key_id", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["site", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "key_id"]
    readonly_fields = ["key_id", "created_at", "created_by", "last_used_at"]
    actions = ["revoke"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return ["name", "site"]
        return ["name", "site", "key_id", "created_at", "created_by", "last_used_at", "revoked_at"]

    def save_model(self, request: HttpRequest, obj: AgentToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, plain = AgentToken.issue(site=obj.site, name=obj.name, created_by=request.user)
        obj.pk = token.pk
        obj.key_id = token.key_id
        # Shown once: only the hash is stored.
        messages.warning(request, f"Copy this token now; it will not be shown again: {plain}")

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        now = timezone.now()
        count = 0
        for token in queryset.filter(revoked_at__isnull=True):
            # One conditional UPDATE per token, each in the audit log (a bulk update sends nothing).
            if AgentToken.objects.filter(pk=token.pk).revoke():
                token.revoked_at = now
                row_changed.send(sender=AgentToken, instance=token, before={"revoked_at": None}, message="Revoked.")
                count += 1
        self.message_user(request, f"Revoked {count} token(s).")


@admin.register(PersonalToken)
class PersonalTokenAdmin(admin.ModelAdmin):
    """An Admin sees everyone's personal tokens and revokes them; only their owner makes them."""

    list_display = ["name", "user", "key_id", "created_at", "last_used_at", "revoked_at", "revoked_by"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["user", "revoked_by"]
    search_fields = ["name", "key_id", "user__username"]
    fields = readonly_fields = ["user", "name", "key_id", "created_at", "last_used_at", "revoked_at", "revoked_by"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a token made by someone else for a user would be impersonation

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        # One by one, so each revocation writes its own history entry and log line.
        count = sum(token.revoke(actor=request.user) for token in queryset.active().select_related("user"))
        self.message_user(request, f"Revoked {count} token(s).")
