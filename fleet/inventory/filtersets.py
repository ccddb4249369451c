"""FilterSets shared by the HTML pages and the API."""

from __future__ import annotations

import django_filters

from fleet.inventory.models import Gpu, Node, NodeInterface, NodeMount, Rack, Site


class SiteFilterSet(django_filters.FilterSet):
    class Meta:
        model = Site
        fields = {"name": ["exact", "icontains"], "region": ["exact"]}


class RackFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(field_name="site__name")

    class Meta:
        model = Rack
        fields = ["site", "name"]


class NodeFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(field_name="site__name")
    rack = django_filters.CharFilter(field_name="rack__name")
    hostname = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["site", "rack", "hostname", "instance_type", "interconnect"]


class GpuFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(field_name="node__site__name")
    hostname = django_filters.CharFilter(field_name="node__hostname")
    model = django_filters.CharFilter(lookup_expr="icontains")
    parent = django_filters.CharFilter(field_name="parent__uuid", help_text="MIG instances of this physical GPU")
    physical = django_filters.BooleanFilter(
        field_name="parent", lookup_expr="isnull", help_text="true: physical GPUs only; false: MIG instances only"
    )

    class Meta:
        model = Gpu
        fields = ["site", "hostname", "model", "uuid", "index", "parent", "physical"]


class NodeInterfaceFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(field_name="node__site__name")
    hostname = django_filters.CharFilter(field_name="node__hostname")

    class Meta:
        model = NodeInterface
        fields = ["site", "hostname", "name", "kind", "fabric"]


class NodeMountFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(field_name="node__site__name")
    hostname = django_filters.CharFilter(field_name="node__hostname")

    class Meta:
        model = NodeMount
        fields = ["site", "hostname", "mountpoint", "fstype", "purpose"]
