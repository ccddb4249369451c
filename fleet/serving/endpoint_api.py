"""Serving endpoints in the fleet API (/api/v1/fleet/endpoints/): list, read, set SLOs."""

from __future__ import annotations

from rest_framework import mixins, viewsets

from fleet.serving.filtersets import EndpointFilterSet
from fleet.serving.models import Endpoint
from fleet.serving.serializers import EndpointSerializer


class EndpointViewSet(mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Serving endpoints, registered by the metrics they report; PATCH sets their region, replicas,
    GPUs, scrape targets and SLOs."""

    queryset = Endpoint.objects.select_related("site").prefetch_related("gpus", "scrape_targets")
    serializer_class = EndpointSerializer
    filterset_class = EndpointFilterSet
    http_method_names = ["get", "patch", "head", "options"]  # created by ingest; PUT would reset every SLO
