"""The compliance API, under /api/v1/compliance/ (goodput.urls)."""

from __future__ import annotations

from compliance.audit import urls as audit
from compliance.gdpr import urls as gdpr
from compliance.pack import urls as pack
from compliance.register import urls as register
from compliance.retention import urls as retention
from compliance.summary import urls as summary

app_name = "compliance-api"

urlpatterns = [
    *register.api_urlpatterns,
    *summary.api_urlpatterns,
    *gdpr.api_urlpatterns,
    *retention.api_urlpatterns,
    *audit.api_urlpatterns,
    *pack.api_urlpatterns,
]
