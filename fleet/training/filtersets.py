"""FilterSets shared by the HTML pages and the API."""

from __future__ import annotations

import django_filters

from fleet.training.models import Job


class JobFilterSet(django_filters.FilterSet):
    site = django_filters.CharFilter(field_name="site__name")
    node = django_filters.CharFilter(field_name="nodes__hostname", distinct=True, help_text="Jobs on this node")

    class Meta:
        model = Job
        fields = ["site", "cluster", "team", "state", "scheduler", "scheduler_id", "priority_tier", "node"]
