"""The audit log API: read-only (list with filters, and one entry), for compliance officers and
admins. There is no write route at all: PUT, PATCH and DELETE answer 405, and the database would
refuse them anyway (migrations 0002 and 0006). Each entry carries its place in the hash chain."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

import django_filters
from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import serializers, viewsets

from compliance.choices import AuditAction
from compliance.models import AuditEntry
from compliance.permissions import CompliancePermission
from console.timebounds import validate_moment


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


class AuditEntryFilterSet(django_filters.FilterSet):
    """Shared by the page, its CSV export and the API. Dates are whole local days, turned into a
    range on ``at`` so the index on it serves the query."""

    actor = django_filters.CharFilter()
    action = django_filters.ChoiceFilter(choices=AuditAction.choices)
    app_label = django_filters.CharFilter()
    model = django_filters.CharFilter()
    object_id = django_filters.CharFilter()
    since = django_filters.DateFilter(method="filter_since", label="From (date)", validators=[validate_moment])
    until = django_filters.DateFilter(method="filter_until", label="To (date, inclusive)", validators=[validate_moment])

    class Meta:
        model = AuditEntry
        fields = ["actor", "action", "app_label", "model", "object_id", "since", "until"]

    def filter_since(self, queryset: QuerySet[AuditEntry], name: str, value: date) -> QuerySet[AuditEntry]:
        return queryset.filter(at__gte=_start_of(value))

    def filter_until(self, queryset: QuerySet[AuditEntry], name: str, value: date) -> QuerySet[AuditEntry]:
        if value >= date.max - timedelta(days=1):
            return queryset  # the end of the calendar: nothing is after it
        return queryset.filter(at__lt=_start_of(value + timedelta(days=1)))


class AuditEntrySerializer(serializers.ModelSerializer):
    # A plain string in the schema: an enum here would collide with the retention policy's
    # "action" enum of the same field name.
    action = serializers.CharField(read_only=True, help_text="One of: " + ", ".join(AuditAction.values))
    # The entry's seal in the hash chain (written by the database at commit; null until then).
    seq = serializers.IntegerField(source="seal.seq", read_only=True, allow_null=True)
    content_hash = serializers.CharField(source="seal.content_hash", read_only=True, allow_null=True)
    prev_hash = serializers.CharField(source="seal.prev_hash", read_only=True, allow_null=True)
    hash = serializers.CharField(source="seal.hash", read_only=True, allow_null=True)

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "actor_id",
            "actor",
            "action",
            "app_label",
            "model",
            "object_id",
            "object_repr",
            "before",
            "after",
            "message",
            "remote_addr",
            # The hash chain (migration 0006): set at commit, walked by manage.py verify_audit_log.
            "seq",
            "content_hash",
            "prev_hash",
            "hash",
        ]
        read_only_fields = fields


class AuditEntryViewSet(viewsets.ReadOnlyModelViewSet):
    """Audit entries, newest first."""

    queryset = AuditEntry.objects.select_related("seal").order_by("-at", "-pk")
    serializer_class = AuditEntrySerializer
    filterset_class = AuditEntryFilterSet
    permission_classes = [CompliancePermission]
    ordering_fields: list[Any] = []  # newest first only: the order the index serves
