from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils import timezone

from console.models import AgentToken


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
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).")
