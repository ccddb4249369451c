"""The capacity pages: the 12-month plan (supply against reserved demand by tier, the pools, team
quotas, orders and power approvals) and the reservations list with the Operator's forms.

Both are server-rendered from fleet.capacity.read (no live topic: the plan moves on dates, not
on telemetry). Every state change goes through that service, which refuses an over-commit and
writes the audit entry; these views only turn its answers into a page.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.views.generic import TemplateView

from console import roles
from console.permissions import DashboardRequiredMixin
from fleet.capacity.actions import approvals, reservations
from fleet.capacity.forms import ReservationChangeForm, ReservationForm
from fleet.capacity.models import Pool, PowerApproval, ProcurementOrder, Reservation, ReservationState, Team
from fleet.capacity.read import planning
from fleet.capacity.read import tables as capacity_tables
from fleet.choices import PriorityTier

ADD_PERMISSION = "fleet.add_reservation"
CHANGE_PERMISSION = "fleet.change_reservation"
# States a reservation can still be cancelled from (reservations.cancel refuses the others with 409).
CANCELLABLE = {ReservationState.REQUESTED, ReservationState.APPROVED, ReservationState.ACTIVE}
# States the page offers a change from (reservations.update_reservation decides what it does).
CHANGEABLE = CANCELLABLE
LIST_LIMIT = 500


class CapacityPlanView(DashboardRequiredMixin, TemplateView):
    """The plan over the next twelve months; the chart reads the same plan the API serves.

    POST (an Admin or a Capacity approver, 403 for anyone else): the ``action`` approve-order,
    reject-order, approve-power or reject-power of the order or power approval ``id``, through
    fleet.capacity.actions.approvals; a refusal is shown on the page (403 naming the rule, 409 on state).
    """

    template_name = "capacity/plan.html"
    decisions = {
        "approve-order": (ProcurementOrder, approvals.approve_order, "approved"),
        "reject-order": (ProcurementOrder, approvals.reject_order, "rejected"),
        "approve-power": (PowerApproval, approvals.approve_power, "approved"),
        "reject-power": (PowerApproval, approvals.reject_power, "rejected"),
    }

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not approvals.may_approve_capacity(request.user):
            raise PermissionDenied("Approving orders and power approvals needs an Admin or a Capacity approver.")
        decision = self.decisions.get(request.POST.get("action", ""))
        pk = request.POST.get("id", "")
        if decision is None or not pk.isdigit():
            return self.render_to_response(self.get_context_data(refusal={"detail": "Unknown action."}), status=400)
        model, decide, verb = decision
        obj = get_object_or_404(model, pk=int(pk))
        try:
            decide(obj, actor=request.user)
        except approvals.ApprovalRefused as exc:
            refusal = {"verb": verb, "what": str(obj), **exc.detail}
            return self.render_to_response(self.get_context_data(refusal=refusal), status=403)
        except approvals.ConflictError as exc:
            refusal = {"verb": verb, "what": str(obj), **exc.detail}
            return self.render_to_response(self.get_context_data(refusal=refusal), status=409)
        messages.success(request, f"{verb.title()}: {obj}.")
        return redirect("capacity:plan")

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        now = timezone.now()
        today = timezone.localdate(now, UTC)
        rows = capacity_tables.pool_rows(now=now)
        context["pool_rows"] = rows
        context["has_pools"] = bool(rows)
        context["can_approve"] = approvals.may_approve_capacity(self.request.user)
        if not rows:
            return context
        context["pool_sections"] = capacity_tables.pool_sections([r.pool for r in rows], self.request, rows=rows)
        plan = planning.plan(months=capacity_tables.PLAN_MONTHS, now=now)
        late, upcoming = capacity_tables.open_orders(today)
        context.update(
            plan=plan,
            tiers=[{"value": t.value, "label": t.label} for t in PriorityTier],
            month_rows=[{**m, "by_tier": [m["reserved"][t.value] for t in PriorityTier]} for m in plan["total"]],
            conflicts=capacity_tables.conflict_months(plan),
            curtailments=capacity_tables.curtailed_months(plan),
            late_orders=[{"order": o, "days_late": (today - o.promised_on).days} for o in late],
            upcoming_orders=[{"order": o, "days_to_go": (o.promised_on - today).days} for o in upcoming],
            approvals=capacity_tables.power_approvals(),
            quota_rows=[r for r in rows if r.quotas],
            quota_queues=any("queue" in q for r in rows for q in r.quotas),
            totals={
                name: sum(getattr(r.figures, name) for r in rows)
                for name in ("installed", "energised", "healthy", "reserved", "reserved_preemptible", "available")
            },
            page_config={"plan": plan, "tiers": [t.value for t in PriorityTier]},
        )
        return context


class TeamView(DashboardRequiredMixin, TemplateView):
    """One team: its members, its quota on each pool (nominal, borrowing and lending limits, use
    now) with its scheduler queue wait beside it, its reservations requested or holding GPUs, and
    its queues' figures per pool, live (the capacity page's panel figures, fleet.scheduler). Any
    role reads; nothing changes here (quotas change through the API, reservations on their page)."""

    template_name = "capacity/team.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        team = get_object_or_404(Team, pk=kwargs["pk"])
        now = timezone.now()
        quotas = capacity_tables.team_quotas(team, now=now)
        context.update(
            team=team,
            members=list(team.members.order_by("username")),
            quotas=quotas,
            sections=capacity_tables.team_sections(team, quotas, self.request),
            reservations=capacity_tables.team_reservations(team, now=now),
        )
        context["quota_queues"] = any("queue" in q for q in quotas)
        return context


class ReservationListView(DashboardRequiredMixin, TemplateView):
    """GET: the reservations, filtered by state, pool and team. POST (the ``action`` field):

    - ``request``: a new reservation from the form (fleet.add_reservation); bad values re-render
      the form with the error on the field, nothing written;
    - ``approve`` / ``cancel`` a reservation (fleet.change_reservation); a refusal (an over-commit,
      a quota, a state moved meanwhile) is shown on the page with status 409, nothing changed;
      approving one's own request is refused the same way with 403 (fleet.capacity.actions.approvals);
    - ``change`` a reservation (fleet.change_reservation, and only its requester or an Admin:
      403 otherwise, before the form is read); GET ``?change=<id>`` shows its form. Once
      approved, a change of what it asks for sends it back to requested (reservations.update_reservation).

    A user without the permission gets 403 whatever the page showed.
    """

    template_name = "capacity/reservations.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        action = request.POST.get("action")
        needed = ADD_PERMISSION if action == "request" else CHANGE_PERMISSION
        if not request.user.has_perm(needed):
            raise PermissionDenied("Requesting, approving or cancelling reservations needs the Operator role.")
        if action == "request":
            return self._request(request)
        if action == "change":
            return self._change(request)
        if action not in ("approve", "cancel"):
            return self.render_to_response(self.get_context_data(action_error="Unknown action."), status=400)
        reservation = get_object_or_404(Reservation.objects.select_related("pool__site"), pk=request.POST.get("id"))
        try:
            if action == "approve":
                reservations.approve(reservation, actor=request.user)
            else:
                reservations.cancel(reservation, actor=request.user)
        except approvals.ApprovalRefused as exc:  # separation of duties: shown on the page, 403
            refusal = {"reservation": reservation, "action": action, **exc.detail}
            return self.render_to_response(self.get_context_data(refusal=refusal), status=403)
        except approvals.ConflictError as exc:
            refusal = {"reservation": reservation, "action": action, **exc.detail}
            if "conflict" in exc.detail:  # the first over-committed window, as dates to show
                window = exc.detail["conflict"]
                refusal["window"] = [datetime.fromisoformat(window[k]) for k in ("start", "end")]
            return self.render_to_response(self.get_context_data(refusal=refusal), status=409)
        verb = "Approved" if action == "approve" else "Cancelled"
        messages.success(request, f"{verb} #{reservation.pk}: {reservation}.")
        return redirect(self._back(request))

    def _request(self, request: HttpRequest) -> HttpResponse:
        form = ReservationForm(request.POST)
        if not form.is_valid():
            return self.render_to_response(self.get_context_data(form=form), status=400)
        try:
            reservation, _ = reservations.create_reservation(
                actor=request.user, via=request.user.get_username(), **form.cleaned_data
            )
        except approvals.ConflictError as exc:  # the team's quota refuses it: say what would fit
            form.add_error("gpus", exc.detail.get("gpus") or exc.detail["detail"])
            return self.render_to_response(self.get_context_data(form=form), status=409)
        messages.success(request, f"Requested #{reservation.pk}: {reservation}. An Operator approves it below.")
        return redirect(self._back(request))

    def _change(self, request: HttpRequest) -> HttpResponse:
        reservation = get_object_or_404(Reservation.objects.select_related("pool__site"), pk=request.POST.get("id"))
        try:
            # Refused before the form is read, as the API refuses before the body is.
            approvals.check_editor(request.user, requester_id=reservation.created_by_id)
            # The form fills its own copy: ``reservation`` stays as stored, for the refusal and the message.
            form = ReservationChangeForm(request.POST, instance=Reservation.objects.get(pk=reservation.pk))
            status = 400
            if form.is_valid():
                status = 409
                changed = reservations.update_reservation(reservation, actor=request.user, changes=form.cleaned_data)
        except approvals.ApprovalRefused as exc:
            refusal = {"reservation": reservation, "action": "change", **exc.detail}
            return self.render_to_response(self.get_context_data(refusal=refusal), status=403)
        except approvals.ConflictError as exc:  # the quota, or a field fixed in its state: on the field
            named = [k for k in exc.detail if k in form.fields]
            form.add_error(named[0] if named else None, exc.detail[named[0] if named else "detail"])
        if form.errors:
            context = self.get_context_data(change_form=form, changing=reservation)
            return self.render_to_response(context, status=status)
        if changed.state != reservation.state:
            messages.warning(request, f"Changed #{changed.pk}: it is {changed.state} again, to be approved anew.")
        else:
            messages.success(request, f"Changed #{changed.pk}: {changed}.")
        return redirect(self._back(request))

    @staticmethod
    def _back(request: HttpRequest) -> str:
        """The list again, with the filters the form was posted from (only the known ones)."""
        query = request.GET.copy()
        for key in list(query):
            if key not in ("state", "pool", "team"):
                del query[key]
        url = reverse("capacity:reservations")
        return f"{url}?{query.urlencode()}" if query else url

    def _filtered(self) -> tuple[QuerySet[Reservation], dict[str, str]]:
        params = self.request.GET
        chosen = {k: params.get(k, "").strip() for k in ("state", "pool", "team")}
        rows = Reservation.objects.select_related("pool__site", "created_by", "approved_by")
        if chosen["state"] in ReservationState.values:
            rows = rows.filter(state=chosen["state"])
        else:
            chosen["state"] = ""
        if chosen["pool"].isdigit():
            rows = rows.filter(pool_id=int(chosen["pool"]))
        else:
            chosen["pool"] = ""
        if chosen["team"]:
            rows = rows.filter(team=chosen["team"])
        return rows.order_by("-start", "-pk"), chosen

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        user = self.request.user
        rows, chosen = self._filtered()
        listed = list(rows[: LIST_LIMIT + 1])
        context["reservations"] = listed[:LIST_LIMIT]
        context["truncated"] = len(listed) > LIST_LIMIT
        context["chosen"] = chosen
        context["states"] = ReservationState.choices
        context["pools"] = list(Pool.objects.select_related("site").order_by("site__name", "name"))
        context["teams"] = list(Reservation.objects.order_by("team").values_list("team", flat=True).distinct())
        context["cancellable"] = CANCELLABLE
        context["can_request"] = user.has_perm(ADD_PERMISSION)
        context["can_change"] = user.has_perm(CHANGE_PERMISSION)
        is_admin = context["can_change"] and roles.is_admin(user)
        # The rows this user may change (reservations.update_reservation refuses anyone else with 403).
        context["changeable"] = {
            r.pk
            for r in context["reservations"]
            if context["can_change"] and r.state in CHANGEABLE and (is_admin or r.created_by_id == user.pk)
        }
        if context["can_request"]:
            context.setdefault("form", ReservationForm())
        if "change_form" not in context and self.request.GET.get("change", "").isdigit() and context["can_change"]:
            changing = Reservation.objects.filter(pk=int(self.request.GET["change"])).first()
            if changing is not None and (is_admin or changing.created_by_id == user.pk):
                context.update(changing=changing, change_form=ReservationChangeForm(instance=changing))
        context["query"] = self.request.GET.urlencode()
        return context
