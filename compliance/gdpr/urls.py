"""The gdpr pages (mounted under /compliance/) and API routes (under /api/v1/compliance/)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import SimpleRouter

from compliance.gdpr import api, views

# SimpleRouter: the areas share /api/v1/compliance/, so no area claims its root view.
router = SimpleRouter()
router.register("processing/records", api.DataAssetViewSet, basename="data-asset")
router.register("processing/processor-records", api.ProcessorRecordViewSet, basename="processor-record")
router.register("processing/requests", api.SubjectRequestViewSet, basename="subject-request")

urlpatterns: list[URLPattern | URLResolver] = [
    path("processing/", views.ProcessingView.as_view(), name="processing"),
]
api_urlpatterns: list[URLPattern | URLResolver] = [*router.urls]
