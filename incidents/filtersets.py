"""FilterSets shared by the incident pages and the API."""

from __future__ import annotations

import django_filters

from incidents.choices import IncidentState, Severity
from incidents.models import ActionItem, Incident, Silence, TimelineEntry


class IncidentFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=IncidentState.choices)
    severity = django_filters.MultipleChoiceFilter(choices=Severity.choices)
    site = django_filters.CharFilter(field_name="labels__site")
    open = django_filters.BooleanFilter(method="filter_open")
    category = django_filters.CharFilter()

    class Meta:
        model = Incident
        fields = ["state", "severity", "site", "category", "open"]

    def filter_open(self, queryset, name, value):  # type: ignore[no-untyped-def]
        return queryset.open() if value else queryset.resolved()


class TimelineEntryFilterSet(django_filters.FilterSet):
    class Meta:
        model = TimelineEntry
        fields = ["incident", "kind"]


class ActionItemFilterSet(django_filters.FilterSet):
    class Meta:
        model = ActionItem
        fields = ["incident", "state", "owner"]


class SilenceFilterSet(django_filters.FilterSet):
    active = django_filters.BooleanFilter(method="filter_active")

    class Meta:
        model = Silence
        fields = ["active"]

    def filter_active(self, queryset, name, value):  # type: ignore[no-untyped-def]
        active = Silence.objects.active().values("pk")
        return queryset.filter(pk__in=active) if value else queryset.exclude(pk__in=active)
