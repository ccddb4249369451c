from django.urls import path

from fleet.api import views

urlpatterns = [
    path("gpu-samples", views.GpuSampleIngestView.as_view(), name="ingest-gpu-samples"),
]
