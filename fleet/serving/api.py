"""The serving API: the endpoints in the fleet API, the serving pages' snapshots, and an endpoint's
SLO figures, change events and eval results.

Change events and eval results: POST a single object or {"items": [...]} (up to
1000), validated whole before anything is written; GET lists them. An agent token writes for its
own site's endpoints; people write with their role (Operator) and read with any role.

A retried request is safe: an item may carry an "id" (the sender's, unique per endpoint); an id
already stored is skipped and counted as repeated.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import generics, mixins, serializers, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live
from console.authentication import AgentOrPersonalTokenAuthentication
from console.permissions import RoleOrSiteAgentWritePermission
from console.ranges import WINDOW_PARAMETERS, RangeError, window_from_query
from console.timebounds import BoundedDatesSerializerMixin
from fleet.serving import read as serving_read
from fleet.serving import slo as serving
from fleet.serving.filtersets import EndpointFilterSet
from fleet.serving.models import Endpoint, EndpointChange, EndpointChangeKind, EndpointEval
from fleet.serving.serializers import (
    EndpointSerializer,
    EndpointSloAnswerSerializer,
    EndpointSnapshotAnswerSerializer,
    ServingOverviewAnswerSerializer,
)

MAX_ITEMS = 1000
# A clock a little ahead is tolerated; an item from the far future is a wrong clock or a wrong unit.
MAX_FUTURE = timedelta(hours=1)
MAX_REPORTED_ERRORS = 20
# Changes that add serving capacity: they carry the time it was ready (load-to-ready, cold start).
CAPACITY_KINDS = frozenset({EndpointChangeKind.SCALE_OUT, EndpointChangeKind.REPLICA_LOAD})


class EndpointWritePermission(RoleOrSiteAgentWritePermission):
    """People: their role's model permissions. An agent token: POSTs only, and only for its own
    site's endpoints (the training API's rule, applied to the endpoint)."""


# A pattern, not an enum, in the schema: drf-spectacular names every enum on a field called "kind"
# after the field, collides with the other "kind" choice sets and warns, which `check --deploy`
# refuses. (An ENUM_NAME_OVERRIDES entry in settings would allow a real enum.)
@extend_schema_field({"type": "string", "pattern": f"^({'|'.join(EndpointChangeKind.values)})$"})
class ChangeKindField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=EndpointChangeKind.choices, **kwargs)


class _ItemSerializer(BoundedDatesSerializerMixin, serializers.Serializer):
    """Common to both item kinds: the sender's id and the time, never in the future."""

    id = serializers.CharField(max_length=128, required=False, allow_blank=False, source="client_id")
    ts = serializers.DateTimeField()

    def validate_ts(self, value: Any) -> Any:
        if value > timezone.now() + MAX_FUTURE:
            raise serializers.ValidationError("Is in the future; send the time the item happened.")
        return value

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                # A misspelt field would otherwise be dropped silently ("scor" for "score").
                raise serializers.ValidationError({unknown[0]: "Unknown field."})
        return super().to_internal_value(data)


class ChangeItemSerializer(_ItemSerializer):
    kind = ChangeKindField()
    from_value = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    to_value = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    model_version = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    ready_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    note = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        ready_at = attrs.get("ready_at")
        if ready_at is None:
            return attrs
        if attrs["kind"] not in CAPACITY_KINDS:
            raise serializers.ValidationError(
                {"ready_at": f"Only a {' or '.join(sorted(CAPACITY_KINDS))} change has a ready time."}
            )
        if ready_at < attrs["ts"]:
            raise serializers.ValidationError(
                {"ready_at": "Is before ts; the capacity cannot be ready before it starts."}
            )
        if ready_at > timezone.now() + MAX_FUTURE:
            raise serializers.ValidationError({"ready_at": "Is in the future; send it once the capacity is ready."})
        return attrs


class EvalItemSerializer(_ItemSerializer):
    suite = serializers.CharField(max_length=100)
    metric = serializers.CharField(max_length=100)
    score = serializers.FloatField()
    model_version = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    higher_is_better = serializers.BooleanField(required=False, default=True)

    def validate_score(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("Must be a finite number.")
        return value


class EndpointChangeSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="client_id", read_only=True)
    kind = ChangeKindField(read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = EndpointChange
        fields = [
            "pk",
            "id",
            "ts",
            "kind",
            "from_value",
            "to_value",
            "model_version",
            "ready_at",
            "note",
            "created_by",
            "created_at",
        ]


class EndpointEvalSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="client_id", read_only=True)

    class Meta:
        model = EndpointEval
        fields = ["pk", "id", "ts", "suite", "metric", "score", "model_version", "higher_is_better", "created_at"]


class BatchError(Exception):
    """A rejected body: the field at fault as items[i].field (or field, for a single object)."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(next(iter(errors.values())))
        self.errors = errors

    def response(self) -> Response:
        field, message = next(iter(self.errors.items()))
        return Response({"error": f"{field}: {message}", "field": field, "errors": self.errors}, status=400)


def _first_message(detail: Any) -> str:
    while isinstance(detail, (list, dict)):
        detail = next(iter(detail.values())) if isinstance(detail, dict) else detail[0]
    return str(detail)


def _flatten(detail: Any, prefix: str) -> dict[str, str]:
    if isinstance(detail, dict):
        return {f"{prefix}.{name}" if prefix else name: _first_message(value) for name, value in detail.items()}
    return {prefix or "non_field_errors": _first_message(detail)}


def parse_items(data: Any, item_serializer: type[serializers.Serializer]) -> list[dict[str, Any]]:
    """Validate a body (one object, or {"items": [...]} of up to MAX_ITEMS); return the items'
    validated data or raise BatchError naming every fault found (the first MAX_REPORTED_ERRORS)."""
    if not isinstance(data, dict):
        raise BatchError({"non_field_errors": 'Send one object, or {"items": [...]}.'})
    if "items" in data:
        if set(data) != {"items"}:
            extra = sorted(set(data) - {"items"})[0]
            raise BatchError({extra: 'Unknown field; a batch is {"items": [...]} only.'})
        raw = data["items"]
        if not isinstance(raw, list) or not raw:
            raise BatchError({"items": "Must be a non-empty list."})
        if len(raw) > MAX_ITEMS:
            raise BatchError({"items": f"Holds {len(raw)} items; the limit is {MAX_ITEMS}."})
        prefixes = [f"items[{i}]" for i in range(len(raw))]
    else:
        raw, prefixes = [data], [""]
    errors: dict[str, str] = {}
    items: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for prefix, item in zip(prefixes, raw, strict=True):
        serializer = item_serializer(data=item)
        if not serializer.is_valid():
            errors.update(_flatten(serializer.errors, prefix))
        else:
            client_id = serializer.validated_data.get("client_id")
            if client_id is not None and client_id in seen:
                errors[f"{prefix}.id"] = f"Repeats the id of {seen[client_id]}."
            elif client_id is not None:
                seen[client_id] = prefix
            items.append(dict(serializer.validated_data))
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
    if errors:
        raise BatchError(errors)
    return items


BATCH_RESPONSES = {
    201: inline_serializer(
        "EndpointItemsStored",
        {
            "written": serializers.IntegerField(),
            "repeated": serializers.IntegerField(help_text="Items whose id was already stored (a retry), skipped"),
        },
    ),
    400: OpenApiResponse(description="Invalid body; nothing written. field names items[i].field"),
    401: OpenApiResponse(description="Missing or invalid token"),
    403: OpenApiResponse(description="The token's site or the user's role does not allow it"),
    404: OpenApiResponse(description="No such endpoint"),
}


class _EndpointItemsView(generics.ListAPIView):
    """GET lists the endpoint's items, oldest first; POST stores a batch whole or not at all."""

    authentication_classes = [AgentOrPersonalTokenAuthentication, SessionAuthentication]
    permission_classes = [EndpointWritePermission]
    model: type[EndpointChange] | type[EndpointEval]
    item_serializer: type[serializers.Serializer]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # the schema generator, without a URL
            return self.model.objects.none()
        endpoint = get_object_or_404(Endpoint.objects.only("pk"), pk=self.kwargs["pk"])
        return self.model.objects.filter(endpoint=endpoint).order_by("ts", "pk")

    def post(self, request: Request, pk: int) -> Response:
        endpoint = get_object_or_404(Endpoint.objects.only("pk", "site_id"), pk=pk)
        self.check_object_permissions(request, endpoint)
        try:
            items = parse_items(request.data, self.item_serializer)
        except BatchError as exc:
            return exc.response()
        user = request.user if isinstance(request.user, AbstractBaseUser) else None
        with transaction.atomic():
            # The endpoint's row lock orders two concurrent retries: the second sees the first's ids.
            Endpoint.objects.select_for_update().only("pk").get(pk=endpoint.pk)
            ids = [item["client_id"] for item in items if item.get("client_id")]
            stored = set(
                self.model.objects.filter(endpoint=endpoint, client_id__in=ids).values_list("client_id", flat=True)
            )
            rows = [
                self.model(endpoint=endpoint, **item, **self.extra_fields(user))
                for item in items
                if item.get("client_id") not in stored
            ]
            self.model.objects.bulk_create(rows)
        return Response(
            {"written": len(rows), "repeated": len(items) - len(rows)},
            status=status.HTTP_201_CREATED if rows else status.HTTP_200_OK,
        )

    def extra_fields(self, user: Any) -> dict[str, Any]:
        return {}


class EndpointChangesView(_EndpointItemsView):
    """An endpoint's change events (model, quantisation, kernel, framework, config)."""

    model = EndpointChange
    item_serializer = ChangeItemSerializer
    serializer_class = EndpointChangeSerializer
    required_permissions = {"GET": ["fleet.view_endpointchange"], "POST": ["fleet.add_endpointchange"]}

    def extra_fields(self, user: Any) -> dict[str, Any]:
        return {"created_by": user}

    @extend_schema(request=ChangeItemSerializer, responses=BATCH_RESPONSES)
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


class EndpointEvalsView(_EndpointItemsView):
    """An endpoint's eval results (suite, metric, score, model version)."""

    model = EndpointEval
    item_serializer = EvalItemSerializer
    serializer_class = EndpointEvalSerializer
    required_permissions = {"GET": ["fleet.view_endpointeval"], "POST": ["fleet.add_endpointeval"]}

    @extend_schema(request=EvalItemSerializer, responses=BATCH_RESPONSES)
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


class EndpointSloView(APIView):
    """An endpoint's SLOs: for TTFT, ITL and availability the SLI over the SLO period, the error
    budget left, the SLI and burn rate over 5 m, 30 m, 1 h, 6 h and 3 d, the multi-window alerts
    firing (``interpolated``: the threshold fell between bucket bounds, so the SLI is an estimate);
    latency percentiles per window; and the figures since each server last started (from its
    latest scrape). Read from the per-minute and per-hour rollups, never raw scrapes."""

    queryset = Endpoint.objects.all()  # reads need fleet.view_endpoint

    @extend_schema(responses=EndpointSloAnswerSerializer)
    def get(self, request: Request, pk: int) -> Response:
        endpoint = get_object_or_404(Endpoint.objects.select_related("site"), pk=pk)
        now = timezone.now()
        return Response(
            {
                "endpoint": {"id": endpoint.pk, "name": endpoint.name, "site": endpoint.site.name},
                "generated_at": now.isoformat(),
                "slo": serving.slo_status(endpoint, now=now),
                "since_start": serving.since_start(endpoint.pk, now=now),
            }
        )


# --- the serving pages' snapshots: the SLO overview and one endpoint's over a range; any role reads
# them and the pages fetch them on load and after a reconnect --------------------------------------


class ServingOverviewView(APIView):
    """Per endpoint: its SLOs, TTFT and ITL p50 / p99 over the last five minutes, request and token
    rates, queue depth, running requests and KV-cache usage, the error budget left and the burn
    rate over 5 m, 30 m, 1 h, 6 h and 3 d per SLO with the multi-window alerts firing, and the last
    hour's per-minute points. Read from the serving rollups."""

    queryset = Endpoint.objects.all()  # reads need fleet.view_endpoint

    @extend_schema(responses=ServingOverviewAnswerSerializer)
    def get(self, request: Request) -> Response:
        live.watch_topic("serving")
        return Response(serving_read.current_overview())


class EndpointSnapshotView(APIView):
    """An endpoint's page over a range ending now: the chart series, the SLO table, the figures
    since each server started, change events and evals (chart markers), and the prompt-length
    distribution against the 7 days before the range."""

    queryset = Endpoint.objects.all()  # reads need fleet.view_endpoint

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "range",
                OpenApiTypes.STR,
                enum=list(serving_read.RANGES),
                default=serving_read.DEFAULT_RANGE,
            ),
            *WINDOW_PARAMETERS,
        ],
        responses=EndpointSnapshotAnswerSerializer,
    )
    def get(self, request: Request, pk: int) -> Response:
        try:
            window = window_from_query(
                request.query_params, presets=serving_read.RANGES, default=serving_read.DEFAULT_RANGE
            )
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        endpoint = get_object_or_404(Endpoint.objects.select_related("site"), pk=pk)
        live.watch_topic(f"endpoint.{endpoint.pk}")
        range_key = window.preset or serving_read.DEFAULT_RANGE
        return Response(serving_read.endpoint_snapshot(endpoint, range_key, window=window))


# --- serving endpoints in the fleet API (/api/v1/fleet/endpoints/): list, read, set SLOs -------------


class EndpointViewSet(mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Serving endpoints, registered by the metrics they report; PATCH sets their region, replicas,
    GPUs, scrape targets and SLOs."""

    queryset = Endpoint.objects.select_related("site").prefetch_related("gpus", "scrape_targets")
    serializer_class = EndpointSerializer
    filterset_class = EndpointFilterSet
    http_method_names = ["get", "patch", "head", "options"]  # created by ingest; PUT would reset every SLO
