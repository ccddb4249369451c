"""The training API: jobs (registered by the training client, a scheduler hook or an operator),
their event batches, and the training pages' snapshots (the goodput overview, one job's). An agent
token writes for its own site's jobs; people write with their role (Operator) and read with any
role."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.authentication import AgentOrPersonalTokenAuthentication
from console.models import AgentToken
from console.permissions import RoleOrSiteAgentWritePermission
from console.ranges import WINDOW_PARAMETERS, RangeError, window_from_query
from fleet.choices import JobState
from fleet.inventory.models import Gpu, Node, Site
from fleet.training import read as training_read
from fleet.training.events import parse_job_events, record_job_events
from fleet.training.filtersets import JobFilterSet
from fleet.training.models import Job
from fleet.training.serializers import (
    JobSnapshotAnswerSerializer,
    TrainingOverviewAnswerSerializer,
    snapshot_part_serializers,
)
from fleet.validation import HOSTNAME_PATTERN, IngestError, read_body, rejected

_HOSTNAME = re.compile(HOSTNAME_PATTERN.removeprefix("^").removesuffix("$"))


class TrainingAPIMixin:
    authentication_classes = [AgentOrPersonalTokenAuthentication, SessionAuthentication]
    permission_classes = [RoleOrSiteAgentWritePermission]


class JobSerializer(serializers.ModelSerializer):
    site = serializers.SlugRelatedField(
        slug_field="name", queryset=Site.objects.all(), required=False, help_text="Implied by an agent token"
    )
    nodes = serializers.ListField(
        child=serializers.CharField(max_length=253),
        required=False,
        write_only=True,
        help_text="Hostnames of the job's nodes (unknown ones are registered at the job's site)",
    )
    gpus = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, write_only=True, help_text="UUIDs of the job's GPUs"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "site",
            "cluster",
            "name",
            "team",
            "framework",
            "gang_size",
            "nodes",
            "gpus",
            "priority_tier",
            "checkpoint_interval_s",
            "scheduler",
            "scheduler_id",
            "state",
            "first_allocated_at",
            "allocated_since",
            "ended_at",
            "last_event_at",
            "last_step",
            "last_step_at",
            "last_step_time_s",
            "last_checkpoint_at",
            "last_checkpoint_step",
            "failures",
            "created_at",
        ]
        read_only_fields = [
            "state",
            "first_allocated_at",
            "allocated_since",
            "ended_at",
            "last_event_at",
            "last_step",
            "last_step_at",
            "last_step_time_s",
            "last_checkpoint_at",
            "last_checkpoint_step",
            "failures",
            "created_at",
        ]
        # (site, scheduler, scheduler_id) is the job's identity: POST with a known one updates it.
        validators: list[Any] = []
        extra_kwargs = {"gang_size": {"min_value": 1, "max_value": 1_000_000}}

    def to_representation(self, instance: Job) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["nodes"] = sorted(n.hostname for n in instance.nodes.all())
        data["gpus"] = sorted(g.uuid for g in instance.gpus.all())
        return data

    def validate_nodes(self, value: list[str]) -> list[str]:
        for hostname in value:
            if not _HOSTNAME.fullmatch(hostname):
                raise serializers.ValidationError(f"{hostname!r} is not a hostname.")
        return sorted(set(value))

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request = self.context["request"]
        token = request.auth if isinstance(request.auth, AgentToken) else None
        site = attrs.get("site") or (self.instance.site if self.instance else None)
        if token is not None:
            if site is not None and site.pk != token.site_id:
                raise serializers.ValidationError({"site": "An agent token registers jobs of its own site only."})
            site = token.site
        if site is None:
            raise serializers.ValidationError({"site": "This field is required."})
        attrs["site"] = site
        if self.instance is not None:
            if site.pk != self.instance.site_id:
                raise serializers.ValidationError({"site": "A job cannot move to another site."})
            for name in ("scheduler", "scheduler_id"):
                if name in attrs and attrs[name] != getattr(self.instance, name):
                    raise serializers.ValidationError(
                        {name: "A job's scheduler identity cannot change; register the other run as a new job."}
                    )
        hostnames = attrs.get("nodes")
        if hostnames:
            elsewhere = sorted(
                Node.objects.filter(hostname__in=hostnames).exclude(site=site).values_list("hostname", flat=True)
            )
            if elsewhere:
                raise serializers.ValidationError({"nodes": f"Nodes of another site: {', '.join(elsewhere)}."})
        uuids = attrs.get("gpus")
        if uuids:
            found = dict(Gpu.objects.filter(uuid__in=uuids).values_list("uuid", "node__site_id"))
            missing = sorted(set(uuids) - set(found))
            if missing:
                raise serializers.ValidationError({"gpus": f"Unknown GPUs: {', '.join(missing[:5])}."})
            foreign = sorted(u for u, s in found.items() if s != site.pk)
            if foreign:
                raise serializers.ValidationError({"gpus": f"GPUs of another site: {', '.join(foreign[:5])}."})
        return attrs

    def save_job(self) -> tuple[Job, bool]:
        """Create the job, or update the one with this scheduler id; return it and whether it is new.

        The row is locked and only the fields this request sets are written: the event writer keeps
        the job's state columns current, and a save of every column from a copy read before a batch
        landed would undo that batch.
        """
        attrs = dict(self.validated_data)
        hostnames = attrs.pop("nodes", None)
        uuids = attrs.pop("gpus", None)
        with transaction.atomic():
            created = False
            if self.instance is not None:
                job = Job.objects.select_for_update().get(pk=self.instance.pk)
            else:
                job, created = Job.objects.select_for_update().get_or_create(
                    site=attrs["site"],
                    scheduler=attrs.get("scheduler", Job._meta.get_field("scheduler").default),
                    scheduler_id=attrs["scheduler_id"],
                    defaults=attrs,
                )
            if not created:
                if "gang_size" in attrs and attrs["gang_size"] != job.gang_size and job.first_allocated_at:
                    # Every hour already accounted is priced at the gang size: changing it would re-price them.
                    raise serializers.ValidationError(
                        {
                            "gang_size": f"The job has run with {job.gang_size} GPUs; register a run with another "
                            "gang size as a new job (another scheduler_id)."
                        }
                    )
                changed = [name for name, value in attrs.items() if getattr(job, name) != value]
                for name in changed:
                    setattr(job, name, attrs[name])
                if changed:
                    job.save(update_fields=changed)
            self.unknown_nodes: list[str] = []
            if hostnames is not None:
                # Existing nodes only: a trainer in a pod knows its pod's name, which is not a node.
                nodes = list(Node.objects.filter(site=job.site, hostname__in=hostnames))
                self.unknown_nodes = sorted(set(hostnames) - {n.hostname for n in nodes})
                job.nodes.set(nodes)
            if uuids is not None:
                job.gpus.set(Gpu.objects.filter(uuid__in=uuids))
        self.instance = job  # what the response shows: the row as written, not the copy read before
        return job, created

    @property
    def data(self) -> Any:
        data = super().data
        if getattr(self, "unknown_nodes", None):
            data["unknown_nodes"] = self.unknown_nodes  # named, not stored: not nodes of this site's fleet
        return data


class JobAnswerSerializer(JobSerializer):
    """A job as the API answers it: beside its fields, the hostnames of its nodes and the UUIDs of
    its GPUs (JobSerializer.to_representation), and on registration the nodes it did not know."""

    nodes = serializers.ListField(child=serializers.CharField(), help_text="Hostnames of the job's nodes")
    gpus = serializers.ListField(child=serializers.CharField(), help_text="UUIDs of the job's GPUs")
    unknown_nodes = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="Hostnames sent that are not this site's nodes"
    )

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "unknown_nodes"]


JOB_WRITE = extend_schema(request=JobSerializer, responses=JobAnswerSerializer)


@extend_schema_view(
    list=extend_schema(responses=JobAnswerSerializer),
    retrieve=extend_schema(responses=JobAnswerSerializer),
    update=JOB_WRITE,
    partial_update=JOB_WRITE,
)
class JobViewSet(TrainingAPIMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet):
    """Training jobs. POST registers a job, or updates the one with the same site, scheduler and
    scheduler_id (so a restarted trainer re-registering is safe): 201 when new, 200 when known."""

    queryset = Job.objects.select_related("site").prefetch_related("nodes", "gpus")
    serializer_class = JobSerializer
    filterset_class = JobFilterSet
    ordering_fields = ["created_at", "name", "team", "gang_size", "last_event_at"]

    @extend_schema(request=JobSerializer, responses={200: JobAnswerSerializer, 201: JobAnswerSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if isinstance(request.auth, AgentToken):
            existing = Job.objects.filter(
                site_id=request.auth.site_id,
                scheduler=serializer.validated_data.get("scheduler", "other"),
                scheduler_id=serializer.validated_data["scheduler_id"],
            ).first()
            if existing is not None:
                self.check_object_permissions(request, existing)
        job, created = serializer.save_job()
        serializer.instance = self.get_queryset().get(pk=job.pk)
        return Response(serializer.data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def perform_update(self, serializer: JobSerializer) -> None:  # type: ignore[override]
        serializer.save_job()


EVENTS_RESPONSES = {
    200: inline_serializer(
        "JobEventsStored",
        {
            "written": serializers.IntegerField(),
            "repeated": serializers.IntegerField(help_text="Events already stored (a retry), skipped"),
            "state": serializers.ChoiceField(choices=JobState.choices),
        },
    ),
    400: OpenApiResponse(description="Invalid batch; the body names the event (index and id) and field"),
    401: OpenApiResponse(description="Missing or invalid token"),
    403: OpenApiResponse(description="The token's site or the user's role does not allow it"),
    404: OpenApiResponse(description="No such job"),
    413: OpenApiResponse(description="Too many events or too many bytes"),
}


class JobEventsView(TrainingAPIMixin, APIView):
    """A batch of one job's events, stored whole or not at all. Events already stored (same id)
    are skipped, so a retry is safe."""

    queryset = Job.objects.all()
    required_permissions = {"POST": ["fleet.add_jobevent"]}

    @extend_schema(
        request=inline_serializer("JobEventBatch", {"events": serializers.ListField(child=serializers.DictField())}),
        responses=EVENTS_RESPONSES,
    )
    def post(self, request: Request, pk: int) -> Response:
        job = get_object_or_404(Job.objects.only("pk", "site_id"), pk=pk)
        self.check_object_permissions(request, job)
        try:
            events = parse_job_events(read_body(request))
            stored = record_job_events(job.pk, events)
        except IngestError as exc:
            return rejected(exc)
        except Job.DoesNotExist:  # deleted between the lookup and the lock
            return Response({"error": f"No job {pk}."}, status=404)
        return Response({"written": stored.written, "repeated": stored.repeated, "state": stored.job.state})


# --- the training pages' snapshots: the goodput overview and one job's; any role reads them and the
# pages fetch them on load and after a reconnect ----------------------------------------------------

# Each preset in hours (whole clock hours: see fleet.training.read); a custom window is both of
# from / to, ISO 8601 (UTC without an offset), read in whole hours (console.ranges).
PRESETS = {key: timedelta(hours=hours) for key, hours in training_read.RANGES.items()}

# Parts the rooms above training add to a job's snapshot (fleet.correlation's ``episodes``), by
# key, registered from their plugins.py (training cannot import them).
_job_snapshot_parts: dict[str, Callable[[Job], Any]] = {}


def register_job_snapshot_part(key: str, part: Callable[[Job], Any], *, described_by: serializers.Field) -> None:
    """Add ``key`` to every job snapshot, its value ``part(job)``; ``described_by`` types it in the schema."""
    _job_snapshot_parts[key] = part
    snapshot_part_serializers[key] = described_by


class TrainingOverviewView(APIView):
    """Cluster goodput over whole clock hours ending with the current one ("1h" is the current hour
    so far, "24h" and "7d" the last 24 and 168 hourly buckets; each with ``since``, its first hour),
    the badput breakdown and hourly stacked series for the range, the top jobs by GPU-hours lost,
    and the jobs holding GPUs with their step rate."""

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "range",
                OpenApiTypes.STR,
                enum=list(training_read.RANGES),
                default=training_read.DEFAULT_RANGE,
            ),
            *WINDOW_PARAMETERS,
        ],
        responses=TrainingOverviewAnswerSerializer,
    )
    def get(self, request: Request) -> Response:
        try:
            window = window_from_query(request.query_params, presets=PRESETS, default=training_read.DEFAULT_RANGE)
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        return Response(
            training_read.overview_snapshot(range_key=window.preset or training_read.DEFAULT_RANGE, window=window)
        )


class JobSnapshotView(APIView):
    """A job's page: its account (exact from every event; for a job of over 50,000 events from its
    hourly accounts, ``exact`` false, as of their last refresh), event timeline, per-minute step
    and GPU series, chart markers, the losses of its failures, and the checkpoint advisor."""

    queryset = Job.objects.all()  # reads need fleet.view_job, as the job's own detail route does

    @extend_schema(parameters=WINDOW_PARAMETERS, responses=JobSnapshotAnswerSerializer)
    def get(self, request: Request, pk: int) -> Response:
        # The job's own window (its last 24 hours) unless from / to ask for another.
        window = None
        if "from" in request.query_params or "to" in request.query_params:
            try:
                window = window_from_query(request.query_params, presets={}, default="")
            except RangeError as exc:
                return Response(exc.as_dict(), status=400)
        job = get_object_or_404(Job.objects.select_related("site"), pk=pk)
        snapshot = training_read.job_snapshot(job, window=window)
        for key, part in _job_snapshot_parts.items():
            snapshot[key] = part(job)
        return Response(snapshot)
