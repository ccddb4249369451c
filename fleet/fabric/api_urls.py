from django.urls import path

from fleet.fabric import api

app_name = "fabric-api"

urlpatterns = [
    path("", api.FabricSnapshotView.as_view(), name="snapshot"),
]
