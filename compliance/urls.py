"""The compliance pages, under /compliance/ (goodput.urls). Each area keeps its routes in its own
module; this one puts them together, with the compliance home page."""

from __future__ import annotations

from django.urls import path

from compliance import urls_audit, urls_gdpr, urls_pack, urls_register, urls_retention, urls_summary, views

app_name = "compliance"

urlpatterns = [
    path("", views.ComplianceHomeView.as_view(), name="home"),
    *urls_register.urlpatterns,
    *urls_summary.urlpatterns,
    *urls_gdpr.urlpatterns,
    *urls_retention.urlpatterns,
    *urls_audit.urlpatterns,
    *urls_pack.urlpatterns,
]
