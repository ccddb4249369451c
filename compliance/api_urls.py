"""The compliance API, under /api/v1/compliance/ (goodput.urls)."""

from __future__ import annotations

from compliance import urls_audit, urls_gdpr, urls_pack, urls_register, urls_retention, urls_summary

app_name = "compliance-api"

urlpatterns = [
    *urls_register.api_urlpatterns,
    *urls_summary.api_urlpatterns,
    *urls_gdpr.api_urlpatterns,
    *urls_retention.api_urlpatterns,
    *urls_audit.api_urlpatterns,
    *urls_pack.api_urlpatterns,
]
