"""The training-content summary pages (mounted under /compliance/) and API routes (under
/api/v1/compliance/)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from compliance import views_summary
from compliance.api import summary

urlpatterns: list[URLPattern | URLResolver] = [
    path("models/<int:pk>/summary/", views_summary.SummaryView.as_view(), name="summary"),
    path("models/<int:pk>/summary/v<int:version>/", views_summary.SummaryVersionView.as_view(), name="summary-version"),
]

_VERSION = "models/<int:pk>/summary/versions/<int:version>/"
api_urlpatterns: list[URLPattern | URLResolver] = [
    path("models/<int:pk>/summary/draft/", summary.SummaryDraftView.as_view(), name="summary-draft"),
    path("models/<int:pk>/summary/publish/", summary.SummaryPublishView.as_view(), name="summary-publish"),
    path("models/<int:pk>/summary/versions/", summary.SummaryVersionListView.as_view(), name="summary-version-list"),
    path(_VERSION, summary.SummaryVersionDetailView.as_view(), name="summary-version-detail"),
    path(_VERSION + "export.<str:fmt>", summary.SummaryExportView.as_view(), name="summary-version-export"),
    path(_VERSION + "diff/", summary.SummaryDiffView.as_view(), name="summary-version-diff"),
]
