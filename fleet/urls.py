from django.urls import path

from fleet.telemetry import views

app_name = "fleet"

urlpatterns = [
    path("", views.FleetDashboardView.as_view(), name="dashboard"),
    path("targets/", views.ScrapeTargetListView.as_view(), name="targets"),
    path("gpus/<str:uuid>/", views.GpuDetailView.as_view(), name="gpu_detail"),
    path("nodes/<str:hostname>/", views.NodeDetailView.as_view(), name="node_detail"),
]
