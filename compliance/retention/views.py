"""The retention page (/compliance/retention/): the policies (enforced on what the console holds,
attested elsewhere, overdue reviews flagged), legal holds, a dry-run preview, a run now, and the
timeline of runs with the partition drops. Compliance officers and admins only."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.generic import TemplateView

from compliance.models import LegalHold
from compliance.permissions import ComplianceRequiredMixin
from compliance.retention.forms import LegalHoldForm, RetentionPolicyForm
from compliance.services import retention


class RetentionView(ComplianceRequiredMixin, TemplateView):
    """POST ``action``: ``policy``, ``hold``, ``release`` (with ``hold`` id), ``preview`` (a dry
    run, shown on the page) or ``run``. A bad form re-renders with its errors (400), writing nothing."""

    template_name = "compliance/retention/retention.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        today = timezone.localdate()
        attestations = retention.attestations(today)
        holds = list(LegalHold.objects.select_related("placed_by", "released_by", "release_requested_by"))
        context.update(
            enforced=retention.effective_policies(),
            attestations=attestations,
            attestations_overdue=sum(1 for a in attestations if a.overdue),
            holds=holds,
            active_holds=sum(1 for h in holds if h.released_at is None),
            timeline=retention.timeline(),
        )
        context.setdefault("policy_form", RetentionPolicyForm(prefix="policy"))
        context.setdefault("hold_form", LegalHoldForm(prefix="hold"))
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        action = request.POST.get("action")
        who = request.user.get_username()
        if action == "preview":
            preview = retention.run_retention(dry_run=True, triggered_by=who)
            return self.render_to_response(self.get_context_data(preview=preview))
        if action == "run":
            runs = retention.run_retention(triggered_by=who)
            deleted, held = sum(r.affected for r in runs), sum(r.held for r in runs)
            messages.success(request, f"Retention applied: {deleted} deleted, {held} kept by legal holds.")
        elif action == "policy":
            form = RetentionPolicyForm(request.POST, prefix="policy")
            if not form.is_valid():
                return self.render_to_response(self.get_context_data(policy_form=form), status=400)
            messages.success(request, f"Policy saved: {form.save()}.")
        elif action == "hold":
            form = LegalHoldForm(request.POST, prefix="hold")
            if not form.is_valid():
                return self.render_to_response(self.get_context_data(hold_form=form), status=400)
            hold = form.save(commit=False)
            hold.placed_by = request.user
            hold.save()
            messages.success(request, f"Legal hold placed: {hold}.")
        elif action == "release":
            raw = request.POST.get("hold", "")
            # ASCII digits only ("²".isdigit() is true), and within the id column's range.
            valid = raw.isascii() and raw.isdigit() and int(raw) < 2**63
            hold = LegalHold.objects.filter(pk=int(raw)).first() if valid else None
            if hold is None:
                return self.render_to_response(self.get_context_data(action_error="No such legal hold."), status=400)
            try:
                hold = retention.release_hold(hold, by=request.user)
            except (retention.HoldAlreadyReleased, retention.SecondPersonRequired) as exc:
                return self.render_to_response(self.get_context_data(action_error=str(exc)), status=409)
            if hold.released_at is None:
                messages.success(
                    request, f"Release of {hold} requested: another compliance officer or an admin approves it."
                )
            else:
                messages.success(request, f"Legal hold released: {hold}.")
        else:
            return self.render_to_response(self.get_context_data(action_error="Unknown action."), status=400)
        return redirect(reverse("compliance:retention"))
