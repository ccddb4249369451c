"""FilterSets shared by the HTML pages and the API."""

from __future__ import annotations

import django_filters

from fleet.telemetry.models import ScrapeTarget


class ScrapeTargetFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(field_name="site__name")

    class Meta:
        model = ScrapeTarget
        fields = ["site", "kind", "health", "enabled"]
