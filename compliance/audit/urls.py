"""The audit pages (mounted under /compliance/) and API routes (under /api/v1/compliance/)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import SimpleRouter

from compliance.audit import api, views

urlpatterns: list[URLPattern | URLResolver] = [
    path("audit/", views.AuditLogView.as_view(), name="audit-list"),
    path("audit.csv", views.AuditExportView.as_view(), name="audit-export"),
]

router = SimpleRouter()
router.register("audit", api.AuditEntryViewSet, basename="audit")

api_urlpatterns: list[URLPattern | URLResolver] = [*router.urls]
