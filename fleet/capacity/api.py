"""The capacity API: pools with their live figures, procurement orders, power approvals, team
quotas, reservations (approve and cancel as actions), the 12-month plan and CSV exports.

People read with any role and write with the Operator's. An agent token (a scheduler hook at a
site) may only request a reservation on one of its own site's pools: anything else is 403.
Separation of duties (fleet.capacity.actions.approvals): orders and power approvals are created requested
and approved by someone else with the approving permission, team quotas need it too, and nobody
but an Admin approves their own request (403 naming the rule).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from decimal import Decimal
from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import mixins, permissions, serializers, status, viewsets
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
from fleet.capacity.actions import approvals, reservations
from fleet.capacity.models import (
    ApprovalStatus,
    OrderApproval,
    Pool,
    PowerApproval,
    ProcurementOrder,
    Reservation,
    ReservationState,
    Team,
    TeamQuota,
)
from fleet.capacity.read import exports, planning, supply
from fleet.capacity.serializers import PlanAnswerSerializer, plan_part_serializers
from fleet.inventory.models import Site

MAX_PLAN_MONTHS = 36


class CapacityPermission(RolePermission):
    """People: their role's model permissions. An agent token: create a reservation, nothing else
    (its site is checked against the pool's in the view, to name the field)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if isinstance(request.auth, AgentToken):
            return getattr(view, "action", None) == "create" and getattr(view, "agent_may_create", False)
        return super().has_permission(request, view)


class CapacityApproverPermission(permissions.BasePermission):
    """The approve and reject actions of orders and power approvals: any signed-in person (never an
    agent token); fleet.capacity.actions.approvals then decides, with a 403 that names the rule."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if isinstance(request.auth, AgentToken) or not user or not user.is_authenticated:
            return False
        return bool(getattr(user, "is_active", False))


def _refused(exc: approvals.ApprovalRefused) -> Response:
    return Response(exc.detail, status=status.HTTP_403_FORBIDDEN)


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
            "reclaim_within_cohort",
            "created_at",
        ]

    def _figures(self, pool: Pool) -> dict[str, int]:
        figures = self.context.get("figures")
        if figures is None or pool.pk not in figures:
            figures = supply.pool_figures([pool])
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
        context = {**self.get_serializer_context(), "figures": supply.pool_figures(pools)}
        data = PoolSerializer(pools, many=True, context=context).data
        return self.get_paginated_response(data) if page is not None else Response(data)


# --- supply ------------------------------------------------------------------------------------------


class _ApprovalFields(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    approved_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    rejected_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    def _refuse_approved_changes(self, attrs: dict[str, Any]) -> None:
        if self.instance is not None:
            refused = approvals.refused_changes(self.instance, attrs)
            if refused:
                raise serializers.ValidationError(refused)


APPROVAL_FIELDS = ["requested_by", "approved_by", "approved_at", "self_approved", "rejected_by", "rejected_at"]


class ProcurementOrderSerializer(_ApprovalFields):
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
            "approval_status",
            *APPROVAL_FIELDS,
            "created_at",
        ]
        read_only_fields = ["approved_at", "self_approved", "rejected_at"]
        extra_kwargs = {
            "count": {"min_value": 1, "max_value": 1_000_000},
            "approval_status": {
                "required": False,
                "help_text": "On create: requested (the default) or approved (an Admin's own, recorded as "
                "self-approved); then POST .../approve/ or .../reject/",
            },
        }

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
        approval = attrs.get("approval_status")
        if self.instance is None and approval == OrderApproval.REJECTED:
            raise serializers.ValidationError({"approval_status": "A new order is requested or approved."})
        if self.instance is not None and approval is not None and approval != self.instance.approval_status:
            raise serializers.ValidationError(
                {"approval_status": "Changes through POST .../approve/ or .../reject/ (separation of duties)."}
            )
        self._refuse_approved_changes(attrs)
        return attrs


REFUSED = OpenApiResponse(description="Refused by a separation-of-duties rule: `detail` says why, `rule` names it")
STATE_CONFLICT = OpenApiResponse(description="Refused by the current state")


class _DecisionActions:
    """``approve`` and ``reject`` actions of orders and power approvals, through
    fleet.capacity.actions.approvals: 403 naming the rule, 409 on the row's state."""

    decide: dict[str, Any]  # "approve" / "reject" -> the approvals function

    @extend_schema(request=None, responses={403: REFUSED, 409: STATE_CONFLICT})
    @action(detail=True, methods=["post"], permission_classes=[CapacityApproverPermission])
    def approve(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """Approve it: an Admin or a Capacity approver who did not request it (an Admin's own is
        recorded as self-approved). From then on it counts as supply."""
        return self._decide("approve")

    @extend_schema(request=None, responses={403: REFUSED, 409: STATE_CONFLICT})
    @action(detail=True, methods=["post"], permission_classes=[CapacityApproverPermission])
    def reject(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """Reject it: it counts as supply no longer."""
        return self._decide("reject")

    def _decide(self, verb: str) -> Response:
        obj = self.get_object()  # type: ignore[attr-defined]
        try:
            obj = self.decide[verb](obj, actor=self.request.user)  # type: ignore[attr-defined]
        except approvals.ApprovalRefused as exc:
            return _refused(exc)
        except approvals.ConflictError as exc:
            return Response(exc.detail, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(obj).data)  # type: ignore[attr-defined]


def _decisions_answer(serializer: type[serializers.Serializer]) -> Any:
    """The approve and reject actions answer with the row as its viewset shows it."""
    decision = extend_schema(responses={200: serializer, 403: REFUSED, 409: STATE_CONFLICT})
    return extend_schema_view(approve=decision, reject=decision)


@_decisions_answer(ProcurementOrderSerializer)
class ProcurementOrderViewSet(_DecisionActions, _NoDeleteViewSet):
    """GPU orders: lead time (promised and actual) and whether late. Created requested; only an
    approved order counts as supply."""

    queryset = ProcurementOrder.objects.select_related("pool", "requested_by", "approved_by", "rejected_by")
    serializer_class = ProcurementOrderSerializer
    filterset_fields = ["pool", "status", "approval_status"]
    decide = {"approve": approvals.approve_order, "reject": approvals.reject_order}

    def perform_create(self, serializer: ProcurementOrderSerializer) -> None:  # type: ignore[override]
        values = dict(serializer.validated_data)
        approve = values.pop("approval_status", OrderApproval.REQUESTED) == OrderApproval.APPROVED
        try:
            serializer.instance = approvals.request_order(actor=self.request.user, approve=approve, **values)
        except approvals.ApprovalRefused as exc:
            raise PermissionDenied(exc.detail) from exc


class PowerApprovalSerializer(_ApprovalFields):
    site = serializers.SlugRelatedField(slug_field="name", queryset=Site.objects.all())

    class Meta:
        model = PowerApproval
        fields = ["id", "site", "added_kw", "expected_on", "status", "reference", *APPROVAL_FIELDS, "created_at"]
        read_only_fields = ["approved_at", "self_approved", "rejected_at"]
        extra_kwargs = {
            "added_kw": {"min_value": Decimal("0.1")},
            "status": {
                "help_text": "On create: requested (the default), or approved/energised (an Admin's own, recorded as "
                "self-approved); then POST .../approve/ or .../reject/, and an edit from approved to energised"
            },
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        new_status = attrs.get("status")
        if self.instance is None and new_status == ApprovalStatus.REJECTED:
            raise serializers.ValidationError({"status": "A new power approval is requested (or approved)."})
        if self.instance is not None and new_status is not None:
            why = approvals.check_status_change(self.instance, new_status)
            if why:
                raise serializers.ValidationError({"status": why})
        self._refuse_approved_changes(attrs)
        return attrs


@_decisions_answer(PowerApprovalSerializer)
class PowerApprovalViewSet(_DecisionActions, _NoDeleteViewSet):
    """Grid or power approvals adding kW to a site. Created requested; approved or energised ones
    count as supply."""

    queryset = PowerApproval.objects.select_related("site", "requested_by", "approved_by", "rejected_by")
    serializer_class = PowerApprovalSerializer
    filterset_fields = ["site", "status"]
    decide = {"approve": approvals.approve_power, "reject": approvals.reject_power}

    def perform_create(self, serializer: PowerApprovalSerializer) -> None:  # type: ignore[override]
        try:
            serializer.instance = approvals.request_power_approval(actor=self.request.user, **serializer.validated_data)
        except approvals.ApprovalRefused as exc:
            raise PermissionDenied(exc.detail) from exc


class TeamQuotaSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all())

    class Meta:
        model = TeamQuota
        fields = ["id", "team", "pool", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"]
        extra_kwargs = {
            "nominal_gpus": {"max_value": 1_000_000},
            "borrowing_limit_gpus": {"max_value": 1_000_000},
            "lending_limit_gpus": {"max_value": 1_000_000},
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        nominal = attrs.get("nominal_gpus", getattr(self.instance, "nominal_gpus", None))
        lending = attrs.get("lending_limit_gpus", getattr(self.instance, "lending_limit_gpus", None))
        if nominal is not None and lending is not None and lending > nominal:
            raise serializers.ValidationError({"lending_limit_gpus": "Must not exceed nominal_gpus (as in Kueue)."})
        return attrs


class TeamQuotaViewSet(_NoDeleteViewSet):
    """Kueue-style quotas: a team's nominal GPUs on a pool, how many more it may borrow (empty: no
    limit) and how many of its nominal GPUs others may borrow (empty: all)."""

    queryset = TeamQuota.objects.select_related("pool")
    serializer_class = TeamQuotaSerializer
    filterset_fields = ["pool", "team"]

    def check_permissions(self, request: Request) -> None:
        super().check_permissions(request)
        if request.method not in ("GET", "HEAD", "OPTIONS"):  # writes: an Admin or a Capacity approver
            try:
                approvals.check_quota_change(request.user)
            except approvals.ApprovalRefused as exc:
                raise PermissionDenied(exc.detail) from exc


# --- reservations ------------------------------------------------------------------------------------

# Fields a reservation keeps once approved: changing its size or window needs a new approval.
# What a reservation asks for: changed while requested, or approved (it goes back to requested,
# reservations.update_reservation); fixed once active or ended.
ASKED_FIELDS = set(reservations.ASKED_FIELDS)
CHANGES_ASKED = (ReservationState.REQUESTED, ReservationState.APPROVED)


class ReservationSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all())
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    approved_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

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
            "preempted_at",
            "preempted_by",
            "preempted_reason",
            "self_approved",
            "created_at",
        ]
        read_only_fields = [
            "state",
            "requested_via",
            "approved_at",
            "preempted_at",
            "preempted_by",
            "preempted_reason",
            "self_approved",
            "created_at",
        ]
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
        if self.instance is not None and self.instance.state not in CHANGES_ASKED:
            fixed = sorted(k for k in ASKED_FIELDS & set(attrs) if attrs[k] != getattr(self.instance, k))
            if fixed:
                raise serializers.ValidationError(
                    {fixed[0]: f"Cannot change once {self.instance.state}; cancel and request anew."}
                )
        return attrs


CONFLICT = OpenApiResponse(description="Refused by the current state: the body names the window and teams, or `gpus`")


class ReservationViewSet(_NoDeleteViewSet):
    """Reservations of GPUs on a pool. POST requests one (state requested); an Operator approves
    it (refused with 409 when it would over-commit supply or the team's quota; it may preempt
    borrowers as the pool's reclaimWithinCohort allows) or cancels it; the beat task moves approved
    ones to active and expired. A request the team's quota cannot admit is refused at once (409,
    `gpus` says what would fit)."""

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
            scope = reservations.client_id_scope(site_id=request.auth.site_id)
        else:
            actor, via = request.user, request.user.get_username()
            scope = reservations.client_id_scope(user_id=request.user.pk)
        try:
            reservation, created = reservations.create_reservation(actor=actor, via=via, scope=scope, **values)
        except approvals.ConflictError as exc:
            return Response(exc.detail, status=status.HTTP_409_CONFLICT)
        return Response(
            ReservationSerializer(reservation, context=self.get_serializer_context()).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(responses={200: ReservationSerializer, 403: REFUSED, 409: CONFLICT})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Change a reservation: only its requester or an Admin, whatever its state (403 naming the
        rule, before the body is read). A change of what it asks for (team, pool, gpus, window,
        tier, priority) is checked against the team's quota as a new request is (409, `gpus` says
        what would fit; nothing stored) and sends an approved one back to requested, to be approved
        again; an active or ended one keeps them (400 naming the field). The note changes alone."""
        reservation = self.get_object()
        try:
            approvals.check_editor(request.user, requester_id=reservation.created_by_id)
            serializer = self.get_serializer(reservation, data=request.data, partial=True)
            serializer.is_valid(raise_exception=True)
            reservation = reservations.update_reservation(
                reservation, actor=request.user, changes=dict(serializer.validated_data)
            )
        except approvals.ApprovalRefused as exc:
            return _refused(exc)
        except approvals.ConflictError as exc:
            return Response(exc.detail, status=status.HTTP_409_CONFLICT)
        return Response(ReservationSerializer(reservation, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses={200: ReservationSerializer, 403: REFUSED, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """Approve a requested reservation (409 with the first over-committed window, or `gpus`)."""
        reservation = self.get_object()
        try:
            reservation = reservations.approve(reservation, actor=request.user)
        except approvals.ApprovalRefused as exc:
            return _refused(exc)
        except approvals.ConflictError as exc:
            return Response(exc.detail, status=status.HTTP_409_CONFLICT)
        return Response(ReservationSerializer(reservation, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses={200: ReservationSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """Cancel a reservation not yet expired."""
        reservation = self.get_object()
        try:
            reservation = reservations.cancel(reservation, actor=request.user)
        except approvals.ConflictError as exc:
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


# Parts the rooms above capacity add to the plan's answer (fleet.scheduler's ``queues``), by key:
# each is given the plan's pool ids and returns what the key holds. Registered from
# their plugins.py (capacity cannot import them), as the job snapshot's parts are
# (fleet.training.api.register_job_snapshot_part).
_capacity_parts: dict[str, Callable[[list[int]], Any]] = {}


def register_capacity_part(key: str, part: Callable[[list[int]], Any], *, described_by: serializers.Field) -> None:
    """Add ``key`` to the plan's answer, its value ``part(pool_ids)``; ``described_by`` types it in the schema."""
    _capacity_parts[key] = part
    plan_part_serializers[key] = described_by


class PlanView(CapacityAPIMixin, APIView):
    """Supply against reserved demand by tier, per pool and in total, per month; with the parts the
    rooms above add for the same pools now (``queues``: each pool's scheduler queues, fleet.scheduler)."""

    @extend_schema(parameters=PLAN_PARAMETERS, responses=PlanAnswerSerializer)
    def get(self, request: Request) -> Response:
        args = _plan_args(request)
        if isinstance(args, Response):
            return args
        months, start = args
        data = planning.plan(months=months, start=start)
        pool_ids = [p["id"] for p in data["pools"]]
        data.update({key: part(pool_ids) for key, part in _capacity_parts.items()})
        return Response(data)


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
        response = HttpResponse(exports.plan_csv(planning.plan(months=months, start=start)), content_type="text/csv")
        response["Content-Disposition"] = 'attachment; filename="capacity-plan.csv"'
        return response


class ReservationsCsvView(CapacityAPIMixin, APIView):
    """Every reservation as CSV."""

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        rows = Reservation.objects.select_related("pool__site").order_by("start", "pk")
        response = HttpResponse(exports.reservations_csv(rows.iterator(chunk_size=2000)), content_type="text/csv")
        response["Content-Disposition"] = 'attachment; filename="reservations.csv"'
        return response
