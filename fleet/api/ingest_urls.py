from django.urls import path

from fleet.api import ingest

urlpatterns = [
    path("gpu-samples", ingest.GpuSampleIngestView.as_view(), name="ingest-gpu-samples"),
    path("prometheus", ingest.PrometheusIngestView.as_view(), name="ingest-prometheus"),
]
