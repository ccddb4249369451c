from django.urls import path

from fleet.power import api

app_name = "power-api"

urlpatterns = [
    path("", api.PowerSnapshotView.as_view(), name="snapshot"),
]
