"""The inventory API: sites and racks, and the nodes' ports and mounts (nodes and GPUs, with their
series, are in fleet.telemetry.api)."""

from __future__ import annotations

from rest_framework import mixins, viewsets

from fleet.inventory.filtersets import NodeInterfaceFilterSet, NodeMountFilterSet, RackFilterSet, SiteFilterSet
from fleet.inventory.models import NodeInterface, NodeMount, Rack, Site
from fleet.inventory.serializers import (
    NodeInterfaceSerializer,
    NodeMountSerializer,
    RackSerializer,
    SiteSerializer,
)


class SiteViewSet(viewsets.ModelViewSet):
    queryset = Site.objects.all()
    serializer_class = SiteSerializer
    filterset_class = SiteFilterSet


class RackViewSet(viewsets.ModelViewSet):
    queryset = Rack.objects.select_related("site")
    serializer_class = RackSerializer
    filterset_class = RackFilterSet


class _SeenByIngest(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Created by the ingest door on first sighting, never here: read, and PATCH what the door
    cannot know (RolePermission: fleet.view_* for reads, fleet.change_* for PATCH; the save is
    audited by compliance.signals like the admin's)."""

    http_method_names = ["get", "patch", "head", "options"]


class NodeInterfaceViewSet(_SeenByIngest):
    queryset = NodeInterface.objects.select_related("node").order_by("node__hostname", "name")
    serializer_class = NodeInterfaceSerializer
    filterset_class = NodeInterfaceFilterSet


class NodeMountViewSet(_SeenByIngest):
    queryset = NodeMount.objects.select_related("node").order_by("node__hostname", "mountpoint")
    serializer_class = NodeMountSerializer
    filterset_class = NodeMountFilterSet
