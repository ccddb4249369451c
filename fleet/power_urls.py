from django.urls import path

from fleet import views_power
from fleet.api import power

app_name = "power"

urlpatterns = [
    path("", views_power.PowerDashboardView.as_view(), name="dashboard"),
]

# Mounted under /api/v1/power/ (console.urls).
api_urlpatterns = ([path("", power.PowerSnapshotView.as_view(), name="snapshot")], "power-api")
