"""Incident pages: the live list, one incident (timeline, roles, actions, postmortem, action
items), MTTx metrics, and silences."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from console.timebounds import moment_problem
from incidents.choices import ActionItemState, IncidentRole, IncidentState, MaintenanceScope, Severity
from incidents.filtersets import IncidentFilterSet
from incidents.models import ActionItem, Finding, Incident, MaintenanceWindow, RunbookLink, Silence
from incidents.services import actions, engine, views_data
from incidents.services.cost import at_risk_gpu_hours, finding_cost
from incidents.services.engine import Actor, TransitionError
from incidents.services.matchers import MatcherError, validate_matchers
from incidents.services.silences import DuplicateSilence, create_silence

User = get_user_model()


# A failure's cost in parts, as its impact reports them (fleet.training.detectors).
_COST_PARTS = (
    ("progress_lost_gpu_h", "progress lost"),
    ("waiting_gpu_h", "waiting to restart"),
    ("reinit_gpu_h", "re-initialisation"),
    ("restore_gpu_h", "restore"),
)


# What an incident's GPU-hours lost cost: fleet.cost registers it from its plugins.py (incidents
# imports no fleet module), returning {"currency", "gpu_hours", "amount"} or None where unpriced.
_gpu_hours_cost: Callable[[int], dict[str, Any] | None] = lambda incident_id: None  # noqa: E731


def register_gpu_hours_cost(cost: Callable[[int], dict[str, Any] | None]) -> None:
    global _gpu_hours_cost
    _gpu_hours_cost = cost


def finding_row_cost(finding: Finding) -> dict[str, Any]:
    """A finding's own cost for its row on the incident page, with the parts of a failure's."""
    cost = finding_cost(finding)
    impact = finding.impact or {}
    if all(key in impact for key, _ in _COST_PARTS):
        cost["parts"] = "Cost: " + " + ".join(f"{float(impact[key]):.2f} {label}" for key, label in _COST_PARTS)
    return cost


class IncidentListView(DashboardRequiredMixin, TemplateView):
    template_name = "incidents/list.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        params = self.request.GET.copy()
        if not params:
            params.setlist("state", [s.value for s in IncidentState if s != IncidentState.RESOLVED])
        filterset = IncidentFilterSet(params, queryset=Incident.objects.select_related("commander"))
        context["filter"] = filterset
        context["incidents"] = filterset.qs.order_by("-detected_at")[:500]
        context["states"] = IncidentState.choices
        context["severities"] = Severity.choices
        context["selected_states"] = params.getlist("state")
        context["selected_severities"] = params.getlist("severity")
        context["site"] = params.get("site", "")
        context["open_counts"] = views_data.open_counts()
        return context


class IncidentDetailView(DashboardRequiredMixin, TemplateView):
    template_name = "incidents/detail.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        incident = get_object_or_404(
            Incident.objects.select_related("commander", "scribe", "communications"), pk=kwargs["pk"]
        )
        context["incident"] = incident
        context["timeline"] = incident.timeline.select_related("actor").order_by("at", "id")
        findings = list(incident.findings.order_by("-last_seen"))
        context["findings"] = [(f, finding_row_cost(f)) for f in findings]
        context["gpu_hours_at_risk"] = at_risk_gpu_hours(findings)
        context["gpu_hours_cost"] = _gpu_hours_cost(incident.pk)
        context["action_items"] = incident.action_items.select_related("owner")
        context["roles"] = IncidentRole.choices
        context["users"] = User.objects.filter(is_active=True).order_by("username")
        context["can_act"] = self.request.user.has_perm("incidents.change_incident")
        context["can_add_items"] = self.request.user.has_perm("incidents.add_actionitem")
        context["item_states"] = ActionItemState.choices
        context["postmortem_fields"] = [
            ("pm_summary", "Summary"),
            ("pm_impact", "Impact"),
            ("pm_root_cause", "Root cause"),
            ("pm_timeline", "Timeline"),
            ("pm_went_well", "What went well"),
            ("pm_went_badly", "What went badly"),
        ]
        context["postmortem"] = {name: getattr(incident, name) for name, _ in context["postmortem_fields"]}
        context["live"] = {"id": incident.pk, "updated_at": incident.updated_at.isoformat()}
        context["severities"] = Severity.choices
        context["runbook"] = RunbookLink.objects.filter(category=incident.category).first()
        context["merged_from"] = incident.merged_from.order_by("pk")
        context["today"] = timezone.localdate()
        return context


DONE = {
    "acknowledge": "Acknowledged.",
    "mitigate": "Marked mitigated.",
    "resolve": "Resolved.",
    "note": "Note added to the timeline.",
    "role": "Role assigned.",
    "postmortem": "Postmortem saved.",
    "add_item": "Action item added.",
    "item_state": "Action item updated.",
    "reopen": "Reopened.",
    "severity": "Severity changed.",
    "merge": "Merged.",
    "postmortem_draft": "Postmortem drafted from the timeline; edit it below.",
}


class IncidentActionView(DashboardRequiredMixin, TemplateView):
    """The detail page's forms post here; each action checks its permission on the server."""

    http_method_names = ["post"]
    PERMISSIONS = {
        "acknowledge": "incidents.change_incident",
        "mitigate": "incidents.change_incident",
        "resolve": "incidents.change_incident",
        "role": "incidents.change_incident",
        "postmortem": "incidents.change_incident",
        "note": "incidents.add_timelineentry",
        "add_item": "incidents.add_actionitem",
        "item_state": "incidents.change_actionitem",
        "reopen": "incidents.change_incident",
        "severity": "incidents.change_incident",
        "merge": "incidents.change_incident",
        "postmortem_draft": "incidents.change_incident",
    }

    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        incident = get_object_or_404(Incident, pk=pk)
        action = request.POST.get("action", "")
        permission = self.PERMISSIONS.get(action)
        if permission is None:
            messages.error(request, f"Unknown action {action!r}.")
            return redirect(incident)
        if not request.user.has_perm(permission):
            raise PermissionDenied("This needs the Operator role.")
        actor = Actor.person(request.user)
        data = request.POST
        try:
            if action in ("acknowledge", "mitigate", "resolve"):
                getattr(engine, f"{action}_incident")(incident, actor=actor, note=data.get("note", "").strip())
            elif action == "note":
                if not data.get("text", "").strip():
                    messages.error(request, "A note needs some text.")
                    return redirect(incident)
                engine.add_note(incident, text=data["text"].strip(), actor=actor)
            elif action == "role":
                role = data.get("role", "")
                if role not in IncidentRole.values:
                    messages.error(request, "Choose a role.")
                    return redirect(incident)
                user = User.objects.filter(username=data.get("username", ""), is_active=True).first()
                engine.assign_role(incident, role=role, user=user, actor=actor)
            elif action == "postmortem":
                fields = {k: data.get(k, "") for k in engine.POSTMORTEM_FIELDS if k in data}
                engine.save_postmortem(incident, actor=actor, **fields)
            elif action == "add_item":
                title = data.get("title", "").strip()
                if not title:
                    messages.error(request, "An action item needs a title.")
                    return redirect(incident)
                owner = User.objects.filter(username=data.get("owner", ""), is_active=True).first()
                due = date.fromisoformat(data["due_date"]) if data.get("due_date") else None
                if due is not None and (problem := moment_problem(due)):
                    raise ValueError(f"due date: {problem}")
                engine.add_action_item(incident, title=title[:300], owner=owner, due_date=due, actor=actor)
            elif action == "item_state":
                item = get_object_or_404(ActionItem, pk=data.get("item"), incident=incident)
                if data.get("state") not in ActionItemState.values:
                    messages.error(request, "Unknown action item state.")
                    return redirect(incident)
                engine.update_action_item(item, actor=actor, state=data["state"])
            elif action == "reopen":
                actions.reopen_incident(incident, actor=actor, note=data.get("note", "").strip())
            elif action == "severity":
                if data.get("severity") not in Severity.values:
                    messages.error(request, "Choose a severity.")
                    return redirect(incident)
                actions.change_severity(incident, severity=data["severity"], actor=actor)
            elif action == "merge":
                raw = data.get("into", "").strip().lstrip("#")
                target = Incident.objects.filter(pk=int(raw)).first() if raw.isascii() and raw.isdigit() else None
                if target is None or len(raw) > 18:
                    messages.error(request, "Give the number of the incident to merge into.")
                    return redirect(incident)
                target = actions.merge_incidents(incident, into=target, actor=actor)
                messages.success(request, f"Merged #{incident.pk} into this incident.")
                return redirect(target)
            elif action == "postmortem_draft":
                actions.draft_postmortem(incident, actor=actor)
        except TransitionError as exc:
            messages.error(request, str(exc))
        except ValueError as exc:
            messages.error(request, f"Invalid input: {exc}")
        else:
            messages.success(request, DONE.get(action, "Saved."))
        return redirect(incident)


class IncidentMetricsView(DashboardRequiredMixin, TemplateView):
    template_name = "incidents/metrics.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        since = timezone.now() - timedelta(days=365)
        data = {
            "mttx": views_data.mttx_by_severity_and_month(since),
            "categories": views_data.by_category(since),
            "gpu_hours": views_data.gpu_hours_by_month(since),
        }
        context.update(data)
        context["chart_data"] = json.loads(json.dumps(data, default=str))
        return context


class SilenceListView(DashboardRequiredMixin, TemplateView):
    template_name = "incidents/silences.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        now = timezone.now()
        context["active"] = Silence.objects.active(now).select_related("created_by")
        context["expired"] = Silence.objects.filter(ends_at__lte=now).select_related("created_by")[:50]
        context["upcoming"] = Silence.objects.filter(starts_at__gt=now)
        context["can_edit"] = self.request.user.has_perm("incidents.add_silence")
        context.setdefault("form", self._initial_form())
        if "preview" not in context:
            context["preview"] = self._preview(context["form"]["matchers"])
        return context

    def _initial_form(self) -> dict[str, str]:
        """Blank, or pre-filled from an incident's labels ("Silence this incident")."""
        form = {"matchers": "", "hours": "2", "comment": ""}
        raw = self.request.GET.get("incident", "")
        if raw.isascii() and raw.isdigit() and len(raw) < 19:
            incident = Incident.objects.filter(pk=int(raw)).first()
            if incident is not None:
                form["matchers"] = format_matchers(actions.silence_matchers_for(incident))
                form["comment"] = f"Incident #{incident.pk}: {incident.title}"[:300]
                form["incident"] = str(incident.pk)
        return form

    @staticmethod
    def _preview(text: str) -> dict[str, Any] | None:
        """The findings firing now that these matchers would silence (None: nothing to preview)."""
        if not text.strip():
            return None
        try:
            matchers = validate_matchers(parse_matchers(text))
        except MatcherError as exc:
            return {"error": str(exc), "findings": []}
        return {"error": "", "findings": actions.silence_preview(matchers)}

    def post(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm("incidents.add_silence"):
            raise PermissionDenied("Silences need the Operator role.")
        if "expire" in request.POST:
            raw = request.POST["expire"]
            if not raw.isascii() or not raw.isdigit() or int(raw) > 2**62:
                return HttpResponseBadRequest("expire must be a silence id.", content_type="text/plain")
            silence = get_object_or_404(Silence, pk=int(raw))
            Silence.objects.filter(pk=silence.pk).update(ends_at=timezone.now())
            messages.success(request, f"Silence {silence} expired.")
            return redirect("incidents:silences")
        form = {k: request.POST.get(k, "") for k in ("matchers", "hours", "comment", "starts_at", "incident")}
        if "preview" in request.POST:
            return self.render_to_response(self.get_context_data(form=form))
        errors = []
        try:
            matchers = validate_matchers(parse_matchers(form["matchers"]))
        except MatcherError as exc:
            errors.append(str(exc))
        try:
            hours = float(form["hours"])
            if not 0 < hours <= 24 * 90:
                raise ValueError
        except ValueError:
            errors.append("Duration must be between a few minutes and 90 days (in hours).")
        starts = _start_time(form.get("starts_at", ""), errors)
        if not form["comment"].strip():
            errors.append("Say why: a silence needs a comment.")
        if errors:
            for error in errors:
                messages.error(request, error)
            return self.render_to_response(self.get_context_data(form=form))
        raw = form["incident"]
        incident = (
            Incident.objects.filter(pk=int(raw)).first() if raw.isascii() and raw.isdigit() and len(raw) < 19 else None
        )
        try:
            if incident is not None:  # "Silence this incident": the silence and its note, together
                silence = actions.silence_incident(
                    incident,
                    matchers=matchers,
                    hours=hours,
                    comment=form["comment"].strip(),
                    actor=Actor.person(request.user),
                    starts_at=starts,
                )
            else:
                silence = create_silence(
                    matchers=matchers,
                    starts_at=starts,
                    ends_at=starts + timedelta(hours=hours),
                    comment=form["comment"].strip(),
                    created_by=request.user,
                )
        except DuplicateSilence as exc:
            messages.error(request, str(exc))
            return self.render_to_response(self.get_context_data(form=form))
        messages.success(request, f"Silenced {silence} until {silence.ends_at:%Y-%m-%d %H:%M} UTC.")
        return redirect(incident) if incident is not None else redirect("incidents:silences")


class MaintenanceView(DashboardRequiredMixin, TemplateView):
    """Maintenance windows per node, rack or site, and the findings they hold out of incidents."""

    template_name = "incidents/maintenance.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        now = timezone.now()
        context["active"] = MaintenanceWindow.objects.active(now).select_related("created_by")
        context["upcoming"] = MaintenanceWindow.objects.filter(starts_at__gt=now).select_related("created_by")
        context["held"] = (
            Finding.objects.firing()
            .filter(in_maintenance__starts_at__lte=now, in_maintenance__ends_at__gt=now)
            .select_related("in_maintenance")[:200]
        )
        context["scopes"] = MaintenanceScope.choices
        context["can_edit"] = self.request.user.has_perm("incidents.add_silence")
        context.setdefault("form", {"scope": "node", "value": "", "hours": "2", "comment": ""})
        return context

    def post(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm("incidents.add_silence"):
            raise PermissionDenied("Maintenance windows need the Operator role.")
        if "end" in request.POST:
            raw = request.POST["end"]
            if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
                return HttpResponseBadRequest("end must be a window id.", content_type="text/plain")
            window = get_object_or_404(MaintenanceWindow, pk=int(raw))
            MaintenanceWindow.objects.filter(pk=window.pk).update(ends_at=timezone.now())
            messages.success(request, f"Maintenance of {window} ended.")
            return redirect("incidents:maintenance")
        form = {k: request.POST.get(k, "").strip() for k in ("scope", "value", "hours", "comment", "starts_at")}
        errors: list[str] = []
        if form["scope"] not in MaintenanceScope.values:
            errors.append("Choose a node, rack or site.")
        if not form["value"] or len(form["value"]) > 200:
            errors.append("Name the node, rack or site (at most 200 characters).")
        try:
            hours = float(form["hours"])
            if not 0 < hours <= 24 * 90:
                raise ValueError
        except ValueError:
            hours = 0
            errors.append("Duration must be between a few minutes and 90 days (in hours).")
        starts = _start_time(form["starts_at"], errors)
        if not form["comment"]:
            errors.append("Say why: a maintenance window needs a comment.")
        if errors:
            for error in errors:
                messages.error(request, error)
            return self.render_to_response(self.get_context_data(form=form))
        window = MaintenanceWindow.objects.create(
            scope=form["scope"],
            value=form["value"],
            starts_at=starts,
            ends_at=starts + timedelta(hours=hours),
            comment=form["comment"],
            created_by=request.user,
        )
        messages.success(request, f"{window} in maintenance until {window.ends_at:%Y-%m-%d %H:%M} UTC.")
        return redirect("incidents:maintenance")


SILENCE_START_WINDOW = timedelta(days=365)


def _start_time(text: str, errors: list[str]) -> datetime:
    """A silence's start: now when empty; else a real date and time within a year of now (30
    February, 9999-12-31 or 'abc' is a message on the form, never a 500)."""
    now = timezone.now()
    if not text.strip():
        return now
    try:
        starts = parse_datetime(text.strip())
    except ValueError:
        starts = None
    if starts is None:
        errors.append("Start must be a real date and time, e.g. 2026-11-29T18:00Z.")
        return now
    if timezone.is_naive(starts):
        starts = timezone.make_aware(starts, UTC)
    if abs(starts - now) > SILENCE_START_WINDOW:
        errors.append("Start must be within a year of now.")
        return now
    return starts


def format_matchers(matchers: list[dict[str, str]]) -> str:
    """The inverse of parse_matchers: [{"name": "site", "op": "=", "value": "ams-1"}] -> 'site="ams-1"'."""
    return ", ".join(f'{m["name"]}{m["op"]}"{m["value"]}"' for m in matchers)


def parse_matchers(text: str) -> list[dict[str, str]]:
    """'hostname="gpu-a-001", alertname=~"GPU.*"' -> matchers, like amtool's syntax."""
    import re

    out = []
    for part in filter(None, (p.strip() for p in re.split(r",(?=(?:[^\"]*\"[^\"]*\")*[^\"]*$)", text))):
        match = re.fullmatch(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"?(.*?)"?', part)
        if not match:
            raise MatcherError(len(out), "matcher", f'cannot read {part!r}; write name="value", name=~"regex", ...')
        out.append({"name": match.group(1), "op": match.group(2), "value": match.group(3)})
    return out
