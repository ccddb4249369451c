"""FilterSets shared by the HTML pages and the API."""

from __future__ import annotations

import django_filters

from fleet.serving.models import Endpoint


class EndpointFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(field_name="site__name")

    class Meta:
        model = Endpoint
        fields = ["site", "name", "framework"]
