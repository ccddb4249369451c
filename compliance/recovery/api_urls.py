"""The recovery API routes, under /api/v1/recovery/ (goodput.urls): the register's own prefix, as
backup jobs name it, not under /api/v1/compliance/ (officers only)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from compliance.recovery import api

app_name = "recovery-api"

urlpatterns: list[URLPattern | URLResolver] = [
    path("backups/", api.BackupReportView.as_view(), name="backup-report"),
    path("items/", api.RecoveryItemListView.as_view(), name="item-list"),
    path("restore-tests/", api.RestoreTestView.as_view(), name="restore-test"),
]
