"""The register pages (mounted under /compliance/) and API routes (under /api/v1/compliance/)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import SimpleRouter

from compliance.register import api, views

urlpatterns: list[URLPattern | URLResolver] = [
    path("models/", views.ModelListView.as_view(), name="model-list"),
    path("models/<int:pk>/", views.ModelDetailView.as_view(), name="model-detail"),
    path("datasets/", views.DatasetListView.as_view(), name="dataset-list"),
    path("datasets/<int:pk>/", views.DatasetDetailView.as_view(), name="dataset-detail"),
]

# SimpleRouter: the other areas share /api/v1/compliance/, so no area claims its root view.
router = SimpleRouter()
router.register("models", api.GpaiModelViewSet, basename="model")
router.register("datasets", api.DatasetViewSet, basename="dataset")
router.register("lineage", api.LineageViewSet, basename="lineage")

api_urlpatterns: list[URLPattern | URLResolver] = [*router.urls]
