"""The pack pages (mounted under /compliance/) and API routes (under /api/v1/compliance/)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import DefaultRouter

from compliance import views_pack
from compliance.api import pack

router = DefaultRouter()
router.include_root_view = False
router.register("packs", pack.CompliancePackViewSet, basename="pack")

urlpatterns: list[URLPattern | URLResolver] = [
    path("packs/", views_pack.PackListView.as_view(), name="pack-list"),
]
api_urlpatterns: list[URLPattern | URLResolver] = [*router.urls]
