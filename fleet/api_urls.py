"""The fleet API (/api/v1/fleet/): one router over the rooms' viewsets."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from fleet.inventory import api as inventory_api
from fleet.serving import api as serving_api
from fleet.telemetry import api as telemetry_api

app_name = "fleet-api"

router = DefaultRouter()
router.register("sites", inventory_api.SiteViewSet)
router.register("racks", inventory_api.RackViewSet)
router.register("nodes", telemetry_api.NodeViewSet)
router.register("gpus", telemetry_api.GpuViewSet)
router.register("endpoints", serving_api.EndpointViewSet)
router.register("scrape-targets", telemetry_api.ScrapeTargetViewSet)
# A node's ports and mounts: found by the ingest door, their fabric and purpose set by Operators.
router.register("interfaces", inventory_api.NodeInterfaceViewSet, basename="interface")
router.register("mounts", inventory_api.NodeMountViewSet, basename="mount")

urlpatterns = [
    path("overview/", telemetry_api.FleetOverviewView.as_view(), name="overview"),
    path("gpu-table/", telemetry_api.GpuTableView.as_view(), name="gpu-table"),
    *router.urls,
]
