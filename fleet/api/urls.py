from django.urls import path
from rest_framework.routers import DefaultRouter

from fleet.api import views

app_name = "fleet-api"

router = DefaultRouter()
router.register("sites", views.SiteViewSet)
router.register("racks", views.RackViewSet)
router.register("nodes", views.NodeViewSet)
router.register("gpus", views.GpuViewSet)
router.register("endpoints", views.EndpointViewSet)
router.register("scrape-targets", views.ScrapeTargetViewSet)

urlpatterns = [
    path("overview/", views.FleetOverviewView.as_view(), name="overview"),
    *router.urls,
]
