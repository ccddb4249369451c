"""The training-content summary pages (mounted under /compliance/) and API routes (under
/api/v1/compliance/)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from compliance.summary import api, views

urlpatterns: list[URLPattern | URLResolver] = [
    path("models/<int:pk>/summary/", views.SummaryView.as_view(), name="summary"),
    path("models/<int:pk>/summary/v<int:version>/", views.SummaryVersionView.as_view(), name="summary-version"),
]

_VERSION = "models/<int:pk>/summary/versions/<int:version>/"
api_urlpatterns: list[URLPattern | URLResolver] = [
    path("models/<int:pk>/summary/draft/", api.SummaryDraftView.as_view(), name="summary-draft"),
    path("models/<int:pk>/summary/publish/", api.SummaryPublishView.as_view(), name="summary-publish"),
    path("models/<int:pk>/summary/versions/", api.SummaryVersionListView.as_view(), name="summary-version-list"),
    path(_VERSION, api.SummaryVersionDetailView.as_view(), name="summary-version-detail"),
    path(_VERSION + "export.<str:fmt>", api.SummaryExportView.as_view(), name="summary-version-export"),
    path(_VERSION + "diff/", api.SummaryDiffView.as_view(), name="summary-version-diff"),
]
