"""The compliance pages, under /compliance/ (goodput.urls). Each area keeps its routes in its own
module; this one puts them together, with the compliance home page."""

from __future__ import annotations

from django.urls import path

from compliance import views
from compliance.audit import urls as audit
from compliance.gdpr import urls as gdpr
from compliance.pack import urls as pack
from compliance.register import urls as register
from compliance.retention import urls as retention
from compliance.summary import urls as summary

app_name = "compliance"

urlpatterns = [
    path("", views.ComplianceHomeView.as_view(), name="home"),
    *register.urlpatterns,
    *summary.urlpatterns,
    *gdpr.urlpatterns,
    *retention.urlpatterns,
    *audit.urlpatterns,
    *pack.urlpatterns,
]
