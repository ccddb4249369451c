from django.urls import path

from fleet.storage import api

app_name = "storage-api"

urlpatterns = [
    path("", api.StorageSnapshotView.as_view(), name="snapshot"),
]
