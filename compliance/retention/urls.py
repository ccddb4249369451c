"""The retention pages (mounted under /compliance/) and API routes (under /api/v1/compliance/)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import SimpleRouter

from compliance.retention import api, views

# SimpleRouter: the areas share /api/v1/compliance/, so no area claims its root view.
router = SimpleRouter()
router.register("retention/policies", api.RetentionPolicyViewSet, basename="retention-policy")
router.register("retention/holds", api.LegalHoldViewSet, basename="legal-hold")
router.register("retention/runs", api.RetentionRunViewSet, basename="retention-run")

urlpatterns: list[URLPattern | URLResolver] = [
    path("retention/", views.RetentionView.as_view(), name="retention"),
]
api_urlpatterns: list[URLPattern | URLResolver] = [
    path("retention/preview/", api.RetentionPreviewView.as_view(), name="retention-preview"),
    path("retention/run/", api.RetentionRunNowView.as_view(), name="retention-run-now"),
    *router.urls,
]
