"""The pack pages (mounted under /compliance/) and API routes (under /api/v1/compliance/)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import DefaultRouter

from compliance.pack import api, views

router = DefaultRouter()
router.include_root_view = False
router.register("packs", api.CompliancePackViewSet, basename="pack")

urlpatterns: list[URLPattern | URLResolver] = [
    path("packs/", views.PackListView.as_view(), name="pack-list"),
]
api_urlpatterns: list[URLPattern | URLResolver] = [*router.urls]
