"""The capacity API: pools with their live figures, procurement orders, power approvals, team
quotas, reservations (approve and cancel as actions), the 12-month plan and CSV exports.

People read with any role and write with the Operator's. An agent token (a scheduler hook at a
site) may only request a reservation on one of its own site's pools: anything else is 403.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.authentication import AgentOrPersonalTokenAuthentication
from console.models import AgentToken
from console.permissions import RolePermission
from console.timebounds import BoundedDatesSerializerMixin, moment_problem
from fleet.capacity import services as capacity
from fleet.capacity.models import Pool, PowerApproval, ProcurementOrder, Reservation, ReservationState, TeamQuota
from fleet.inventory.models import Site

MAX_PLAN_MONTHS = 36


class CapacityPermission(RolePermission):
    """People: their role's model permissions. An agent token: create a reservation, nothing else
    (its site is checked against the pool's in the view, to name the field)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if isinstance(request.auth, AgentToken):
            return getattr(view, "action", None) == "create" and getattr(view, "agent_may_create", False)
        return super().has_permission(request, view)


class CapacityAPIMixin:
    authentication_classes = [AgentOrPersonalTokenAuthentication, SessionAuthentication]
    permission_classes = [CapacityPermission]


class _NoDeleteViewSet(
    CapacityAPIMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.ReadOnlyModelViewSet,
):
    http_method_names = ["get", "post", "patch", "head", "options"]


# --- pools -----------------------------------------------------------------------------------------


class PoolSerializer(serializers.ModelSerializer):
    site = serializers.SlugRelatedField(slug_field="name", queryset=Site.objects.all())
    installed = serializers.SerializerMethodField()
    energised = serializers.SerializerMethodField()
    healthy = serializers.SerializerMethodField()
    reserved = serializers.SerializerMethodField()
    reserved_preemptible = serializers.SerializerMethodField()
    available = serializers.SerializerMethodField()

    class Meta:
        model = Pool
        fields = [
            "id",
            "site",
            "gpu_model",
            "name",
            "installed",
            "energised",
            "healthy",
            "reserved",
            "reserved_preemptible",
            "available",
            "created_at",
        ]

    def _figures(self, pool: Pool) -> dict[str, int]:
        figures = self.context.get("figures")
        if figures is None or pool.pk not in figures:
            figures = capacity.pool_figures([pool])
        return figures[pool.pk].as_dict()

    def get_installed(self, pool: Pool) -> int:
        return self._figures(pool)["installed"]

    def get_energised(self, pool: Pool) -> int:
        return self._figures(pool)["energised"]

    def get_healthy(self, pool: Pool) -> int:
        return self._figures(pool)["healthy"]

    def get_reserved(self, pool: Pool) -> int:
        return self._figures(pool)["reserved"]

    def get_reserved_preemptible(self, pool: Pool) -> int:
        return self._figures(pool)["reserved_preemptible"]

    def get_available(self, pool: Pool) -> int:
        return self._figures(pool)["available"]


class PoolViewSet(_NoDeleteViewSet):
    """GPU pools per site and model, with installed, energised, healthy, reserved and available GPUs."""

    queryset = Pool.objects.select_related("site")
    serializer_class = PoolSerializer
    filterset_fields = ["site", "gpu_model"]

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        pools = list(page) if page is not None else list(self.filter_queryset(self.get_queryset()))
        context = {**self.get_serializer_context(), "figures": capacity.pool_figures(pools)}
        data = PoolSerializer(pools, many=True, context=context).data
        return self.get_paginated_response(data) if page is not None else Response(data)


# --- supply ------------------------------------------------------------------------------------------


class ProcurementOrderSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    lead_time_days = serializers.IntegerField(read_only=True)
    actual_lead_time_days = serializers.IntegerField(read_only=True, allow_null=True)
    late = serializers.SerializerMethodField()

    class Meta:
        model = ProcurementOrder
        fields = [
            "id",
            "pool",
            "count",
            "ordered_on",
            "promised_on",
            "delivered_on",
            "status",
            "vendor",
            "reference",
            "lead_time_days",
            "actual_lead_time_days",
            "late",
            "created_at",
        ]
        extra_kwargs = {"count": {"min_value": 1, "max_value": 1_000_000}}

    def get_late(self, order: ProcurementOrder) -> bool:
        return order.is_late(date.today())

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        ordered = attrs.get("ordered_on", getattr(self.instance, "ordered_on", None))
        promised = attrs.get("promised_on", getattr(self.instance, "promised_on", None))
        delivered = attrs.get("delivered_on", getattr(self.instance, "delivered_on", None))
        if ordered and promised and promised < ordered:
            raise serializers.ValidationError({"promised_on": "Is before ordered_on."})
        if ordered and delivered and delivered < ordered:
            raise serializers.ValidationError({"delivered_on": "Is before ordered_on."})
        if delivered and delivered > date.today():
            raise serializers.ValidationError({"delivered_on": "Is in the future; set it once delivered."})
        return attrs


class ProcurementOrderViewSet(_NoDeleteViewSet):
    """GPU orders: lead time (promised and actual) and whether late."""

    queryset = ProcurementOrder.objects.select_related("pool")
    serializer_class = ProcurementOrderSerializer
    filterset_fields = ["pool", "status"]


class PowerApprovalSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    site = serializers.SlugRelatedField(slug_field="name", queryset=Site.objects.all())

    class Meta:
        model = PowerApproval
        fields = ["id", "site", "added_kw", "expected_on", "status", "reference", "created_at"]
        extra_kwargs = {"added_kw": {"min_value": Decimal("0.1")}}


class PowerApprovalViewSet(_NoDeleteViewSet):
    """Grid or power approvals adding kW to a site."""

    queryset = PowerApproval.objects.select_related("site")
    serializer_class = PowerApprovalSerializer
    filterset_fields = ["site", "status"]


class TeamQuotaSerializer(serializers.ModelSerializer):
    class Meta:
        model = TeamQuota
        fields = ["id", "team", "pool", "nominal_gpus", "borrowing_limit_gpus"]


class TeamQuotaViewSet(_NoDeleteViewSet):
    """Kueue-style quotas: a team's nominal GPUs on a pool and how many more it may borrow."""

    queryset = TeamQuota.objects.select_related("pool")
    serializer_class = TeamQuotaSerializer
    filterset_fields = ["pool", "team"]


# --- reservations ------------------------------------------------------------------------------------

# Fields a reservation keeps once approved: changing its size or window needs a new approval.
FIXED_ONCE_APPROVED = {"team", "pool", "gpus", "start", "end", "tier"}


class ReservationSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    approved_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Reservation
        fields = [
            "id",
            "team",
            "pool",
            "gpus",
            "start",
            "end",
            "tier",
            "priority",
            "state",
            "note",
            "client_id",
            "created_by",
            "requested_via",
            "approved_by",
            "approved_at",
            "created_at",
        ]
        read_only_fields = ["state", "requested_via", "approved_at", "created_at"]
        extra_kwargs = {
            "gpus": {"min_value": 1, "max_value": 1_000_000},
            "client_id": {
                "validators": [],
                "allow_blank": False,
                "help_text": "The sender's id, unique among the sender's (its site's, or the person's): a repeated "
                "create with the same fields returns the first, one with other fields is a 409",
            },
        }

    def validate_client_id(self, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise serializers.ValidationError("Must not be blank: send an id, or leave it out.")
        if value is not None and self.instance is not None and value != self.instance.client_id:
            taken = Reservation.objects.filter(client_scope=self.instance.client_scope, client_id=value)
            if taken.exclude(pk=self.instance.pk).exists():
                raise serializers.ValidationError("Is the id of another of this sender's reservations.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start = attrs.get("start", getattr(self.instance, "start", None))
        end = attrs.get("end", getattr(self.instance, "end", None))
        if start is not None and end is not None and end <= start:
            raise serializers.ValidationError({"end": "Must be after start."})
        if self.instance is not None and self.instance.state != ReservationState.REQUESTED:
            fixed = sorted(k for k in FIXED_ONCE_APPROVED & set(attrs) if attrs[k] != getattr(self.instance, k))
            if fixed:
                raise serializers.ValidationError(
                    {fixed[0]: f"Cannot change once {self.instance.state}; cancel and request anew."}
                )
        return attrs


CONFLICT = OpenApiResponse(description="Refused by the current state: the body names the window and teams, or `gpus`")


class ReservationViewSet(_NoDeleteViewSet):
    """Reservations of GPUs on a pool. POST requests one (state requested); an Operator approves
    it (refused with 409 when it would over-commit energised supply or the team's quota) or
    cancels it; the beat task moves approved ones to active and expired."""

    queryset = Reservation.objects.select_related("pool", "created_by", "approved_by")
    serializer_class = ReservationSerializer
    filterset_fields = ["pool", "team", "tier", "state"]
    ordering_fields = ["start", "end", "priority", "created_at"]
    agent_may_create = True

    @extend_schema(responses={200: ReservationSerializer, 201: ReservationSerializer, 409: CONFLICT})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        if isinstance(request.auth, AgentToken):
            if values["pool"].site_id != request.auth.site_id:
                raise PermissionDenied({"pool": "Is at another site than this agent token's."})
            actor, via = None, str(request.user)
            scope = capacity.client_id_scope(site_id=request.auth.site_id)
        else:
            actor, via = request.user, request.user.get_username()
            scope = capacity.client_id_scope(user_id=request.user.pk)
        try:
            reservation, created = capacity.create_reservation(actor=actor, via=via, scope=scope, **values)
        except capacity.ConflictError as exc:
            return Response(exc.detail, status=status.HTTP_409_CONFLICT)
        return Response(
            ReservationSerializer(reservation, context=self.get_serializer_context()).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    def perform_update(self, serializer: ReservationSerializer) -> None:  # type: ignore[override]
        from django.contrib.admin.models import CHANGE, LogEntry

        with transaction.atomic():
            changed = sorted(k for k, v in serializer.validated_data.items() if getattr(serializer.instance, k) != v)
            reservation = serializer.save()
            if changed:
                LogEntry.objects.log_actions(  # type: ignore[attr-defined]
                    user_id=self.request.user.pk,
                    queryset=[reservation],
                    action_flag=CHANGE,
                    change_message=f"Changed {', '.join(changed)}.",
                )

    @extend_schema(request=None, responses={200: ReservationSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """Approve a requested reservation (409 with the first over-committed window, or `gpus`)."""
        reservation = self.get_object()
        try:
            reservation = capacity.approve(reservation, actor=request.user)
        except capacity.ConflictError as exc:
            return Response(exc.detail, status=status.HTTP_409_CONFLICT)
        return Response(ReservationSerializer(reservation, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses={200: ReservationSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """Cancel a reservation not yet expired."""
        reservation = self.get_object()
        try:
            reservation = capacity.cancel(reservation, actor=request.user)
        except capacity.ConflictError as exc:
            return Response(exc.detail, status=status.HTTP_409_CONFLICT)
        return Response(ReservationSerializer(reservation, context=self.get_serializer_context()).data)


# --- the plan and the exports ---------------------------------------------------------------------


def _plan_args(request: Request) -> tuple[int, date | None] | Response:
    raw = request.query_params.get("months", "12")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PLAN_MONTHS:
        return Response({"months": f"Must be a whole number from 1 to {MAX_PLAN_MONTHS}."}, status=400)
    start = request.query_params.get("start")
    if start is None:
        return int(raw), None
    try:
        day = date.fromisoformat(start)
    except ValueError:
        return Response({"start": "Must be a date, YYYY-MM-DD."}, status=400)
    if problem := moment_problem(day):
        return Response({"start": problem}, status=400)
    return int(raw), day


PLAN_PARAMETERS = [
    OpenApiParameter("months", OpenApiTypes.INT, default=12, description=f"1 to {MAX_PLAN_MONTHS}"),
    OpenApiParameter("start", OpenApiTypes.DATE, required=False, description="Default: this month"),
]


class PlanView(CapacityAPIMixin, APIView):
    """Supply against reserved demand by tier, per pool and in total, per month."""

    @extend_schema(parameters=PLAN_PARAMETERS, responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        args = _plan_args(request)
        if isinstance(args, Response):
            return args
        months, start = args
        return Response(capacity.plan(months=months, start=start))


class PlanCsvView(CapacityAPIMixin, APIView):
    """The plan as CSV, one row per pool and month, then the totals."""

    @extend_schema(
        parameters=PLAN_PARAMETERS,
        responses={(200, "text/csv"): OpenApiTypes.STR, 400: inline_serializer("PlanArgsError", {})},
    )
    def get(self, request: Request) -> HttpResponse:
        args = _plan_args(request)
        if isinstance(args, Response):
            return args
        months, start = args
        response = HttpResponse(capacity.plan_csv(capacity.plan(months=months, start=start)), content_type="text/csv")
        response["Content-Disposition"] = 'attachment; filename="capacity-plan.csv"'
        return response


class ReservationsCsvView(CapacityAPIMixin, APIView):
    """Every reservation as CSV."""

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        rows = Reservation.objects.select_related("pool__site").order_by("start", "pk")
        response = HttpResponse(capacity.reservations_csv(rows.iterator(chunk_size=2000)), content_type="text/csv")
        response["Content-Disposition"] = 'attachment; filename="reservations.csv"'
        return response
