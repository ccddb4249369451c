from django.urls import include, path
from rest_framework.routers import DefaultRouter

from fleet.cost import api

app_name = "cost-api"

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("prices", api.PoolPriceViewSet, basename="poolprice")

urlpatterns = [
    path("", api.CostSnapshotView.as_view(), name="snapshot"),
    path("training/", api.CostPartView.as_view(part="training"), name="training"),
    path("idle/", api.CostPartView.as_view(part="idle"), name="idle"),
    path("reserved/", api.CostPartView.as_view(part="reserved"), name="reserved"),
    path("incidents/", api.CostPartView.as_view(part="incidents"), name="incidents"),
    path("serving/", api.CostPartView.as_view(part="serving"), name="serving"),
    path("own-or-rent/", api.CostPartView.as_view(part="own-or-rent"), name="own-or-rent"),
    path("export.csv", api.CostCsvView.as_view(), name="export"),
    path("", include(router.urls)),
]
