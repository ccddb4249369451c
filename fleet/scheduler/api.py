"""The scheduler API (/api/v1/scheduler/): the queues with their pool and team (and the ones their
names suggest), and quota drift against the console's team quotas.

Any role reads. Operators and Admins map a queue (PATCH pool and team; RolePermission:
fleet.change_schedulerqueue; audited by compliance.signals). Importing the scheduler's quota into
TeamQuota follows the console's quota rule (fleet.capacity.actions.approvals: an Admin or a Capacity
approver), 403 naming the rule for anyone else.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.capacity.actions import approvals
from fleet.capacity.models import Pool, Team
from fleet.scheduler import drift, mapping
from fleet.scheduler.models import SchedulerQueue
from fleet.scheduler.serializers import QuotaDriftAnswerSerializer, QuotaImportedSerializer

VIEW = "fleet.view_schedulerqueue"


class SchedulerQueueSerializer(serializers.ModelSerializer):
    site = serializers.SlugRelatedField(slug_field="name", read_only=True)
    pool = serializers.PrimaryKeyRelatedField(queryset=Pool.objects.all(), allow_null=True, required=False)
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all(), allow_null=True, required=False)
    suggested_pool = serializers.SerializerMethodField()
    suggested_team = serializers.SerializerMethodField()

    class Meta:
        model = SchedulerQueue
        fields = [
            "id",
            "site",
            "scheduler",
            "kind",
            "name",
            "cohort",
            "pool",
            "team",
            "suggested_pool",
            "suggested_team",
        ]
        read_only_fields = ["scheduler", "kind", "name", "cohort"]

    def _suggestion(self, queue: SchedulerQueue) -> mapping.Suggestion:
        found = self.context.get("suggestions")
        if found is None or queue.pk not in found:
            found = mapping.suggestions([queue])
        return found[queue.pk]

    def get_suggested_pool(self, queue: SchedulerQueue) -> int | None:
        pool = self._suggestion(queue).pool
        return pool.pk if pool else None

    def get_suggested_team(self, queue: SchedulerQueue) -> str | None:
        team = self._suggestion(queue).team
        return team.name if team else None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None and "pool" in attrs:
            try:
                mapping.check_mapping(self.instance, pool=attrs["pool"])
            except mapping.MappingRefused as exc:
                raise serializers.ValidationError(exc.detail) from exc
        return attrs

    def update(self, instance: SchedulerQueue, validated_data: dict[str, Any]) -> SchedulerQueue:
        return mapping.set_mapping(instance, changes=validated_data)


class SchedulerQueueViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin, viewsets.GenericViewSet
):
    """Queues registered by the ingest door on first sighting (Kueue ClusterQueues and LocalQueues,
    Slurm partitions and accounts, Kubernetes namespaces): read, and PATCH the pool and team they
    stand for (a LocalQueue or an account: the team only)."""

    queryset = SchedulerQueue.objects.select_related("site", "pool", "team")
    serializer_class = SchedulerQueueSerializer
    filterset_fields = ["site", "scheduler", "kind", "pool", "team"]
    http_method_names = ["get", "patch", "head", "options"]

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        queues = list(page) if page is not None else list(queryset)
        context = {**self.get_serializer_context(), "suggestions": mapping.suggestions(queues)}
        data = SchedulerQueueSerializer(queues, many=True, context=context).data
        return self.get_paginated_response(data) if page is not None else Response(data)


class QuotaDriftView(APIView):
    """Every queue mapped to a pool and team, its GPU quota as the scheduler reports it beside the
    team's TeamQuota on the pool; ``status`` match, drift, missing-in-console, missing-in-scheduler
    or missing-both. ``?all=0`` (the default) lists only those that do not match."""

    required_permissions = {"GET": [VIEW], "HEAD": [VIEW], "OPTIONS": [VIEW]}

    @extend_schema(responses={200: QuotaDriftAnswerSerializer})
    def get(self, request: Request) -> Response:
        rows = drift.quota_drift()
        show_all = request.query_params.get("all") in ("1", "true")
        return Response(
            {
                "resource": drift.GPU_RESOURCE,
                "mapped_queues": len(rows),
                "drifted": sum(1 for r in rows if r.drifted),
                "results": [r.as_dict() for r in rows if show_all or r.drifted],
            }
        )


class QuotaImportView(APIView):
    """Import a queue's GPU quota as the scheduler reports it into the team's TeamQuota on the
    queue's pool (created or updated; +Inf limits become no limit). An Admin or a Capacity
    approver; 403 naming the rule for anyone else."""

    # Any role reaches it; approvals.check_quota_change then refuses with 403 naming the rule.
    required_permissions = {"POST": [VIEW], "OPTIONS": [VIEW]}

    @extend_schema(
        request=inline_serializer("QuotaImport", {"queue": serializers.IntegerField()}),
        responses={
            200: QuotaImportedSerializer,
            400: OpenApiResponse(description="The queue is unmapped, or its values break TeamQuota's rules"),
            403: OpenApiResponse(description="Not an Admin or a Capacity approver: `rule` names the rule"),
            409: OpenApiResponse(description="The scheduler reports no GPU quota for the queue"),
        },
    )
    def post(self, request: Request) -> Response:
        try:
            approvals.check_quota_change(request.user)  # before anything is read: refusals say nothing
        except approvals.ApprovalRefused as exc:
            return Response(exc.detail, status=status.HTTP_403_FORBIDDEN)
        queue_id = request.data.get("queue") if hasattr(request.data, "get") else None
        if not isinstance(queue_id, int) and not (isinstance(queue_id, str) and queue_id.isdigit()):
            return Response({"queue": ["A queue id is required."]}, status=status.HTTP_400_BAD_REQUEST)
        queue = SchedulerQueue.objects.select_related("site", "pool", "team").filter(pk=int(queue_id)).first()
        if queue is None:
            return Response({"queue": [f"No queue {queue_id}."]}, status=status.HTTP_400_BAD_REQUEST)
        try:
            quota = drift.import_quota(queue, actor=request.user)
        except approvals.ApprovalRefused as exc:
            return Response(exc.detail, status=status.HTTP_403_FORBIDDEN)
        except drift.ImportRefused as exc:
            code = status.HTTP_409_CONFLICT if exc.conflict else status.HTTP_400_BAD_REQUEST
            return Response(exc.detail, status=code)
        return Response(
            {
                "id": quota.pk,
                "team": quota.team_id,
                "pool": quota.pool_id,
                "nominal_gpus": quota.nominal_gpus,
                "borrowing_limit_gpus": quota.borrowing_limit_gpus,
                "lending_limit_gpus": quota.lending_limit_gpus,
            }
        )
