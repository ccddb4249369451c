"""The inventory API: sites and racks (nodes and GPUs, with their series, are in fleet.telemetry.api)."""

from __future__ import annotations

from rest_framework import viewsets

from fleet.inventory.filtersets import RackFilterSet, SiteFilterSet
from fleet.inventory.models import Rack, Site
from fleet.inventory.serializers import RackSerializer, SiteSerializer


class SiteViewSet(viewsets.ModelViewSet):
    queryset = Site.objects.all()
    serializer_class = SiteSerializer
    filterset_class = SiteFilterSet


class RackViewSet(viewsets.ModelViewSet):
    queryset = Rack.objects.select_related("site")
    serializer_class = RackSerializer
    filterset_class = RackFilterSet
