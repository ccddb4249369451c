from django.urls import path

from fleet.ingest import api as ingest

urlpatterns = [
    path("gpu-samples", ingest.GpuSampleIngestView.as_view(), name="ingest-gpu-samples"),
    path("prometheus", ingest.PrometheusIngestView.as_view(), name="ingest-prometheus"),
    path("prometheus/remote-write", ingest.PrometheusRemoteWriteView.as_view(), name="ingest-prometheus-remote-write"),
]
