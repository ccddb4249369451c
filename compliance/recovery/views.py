"""The recovery pages (/recovery/): the register with each item's state, filters by state and
class, the forms that add an item and record a restore test; an item's page with its edit form,
its backup reports and its restore tests. Reads need compliance.view_recoveryitem; each form its
own add/change permission (compliance.permissions). A bad submit re-renders with the errors on the
fields (400) and writes nothing; changes are audited (compliance.signals)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.views.generic import TemplateView

from compliance.models import RecoveryItem
from compliance.permissions import RECOVERY_ADD, RECOVERY_CHANGE, RESTORE_TEST_ADD, RecoveryRequiredMixin
from compliance.recovery.forms import RecoveryItemForm, RegisterFilterForm, RestoreTestForm, defaults_text
from compliance.services import recovery

BACKUPS_SHOWN = 50


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(permission):
        raise PermissionDenied(RecoveryRequiredMixin.permission_denied_message)


def row(state: recovery.ItemState, now: Any) -> dict[str, Any]:
    """One item as the page shows it (its figures from compliance.services.recovery, as the API's)."""
    copy_site, copy_tier = recovery.copy_location(state)
    age = state.backup_age(now)
    return {
        "item": state.item,
        "state": recovery.state_of(state, now),
        "problems": recovery.problems(state, now),
        "age": age,
        "age_ratio": None if age is None else age / state.item.rpo,
        "copy_site": copy_site,
        "copy_tier": copy_tier,
        "last_test": state.last_test,
        "failing": recovery.backup_failing(state),
    }


class RegisterView(RecoveryRequiredMixin, TemplateView):
    template_name = "recovery/register.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.POST.get("action") == "restore":
            _require(request, RESTORE_TEST_ADD)
            restore_form = RestoreTestForm(request.POST)
            if not restore_form.is_valid():
                return self.render_to_response(self.get_context_data(restore_form=restore_form), status=400)
            data = restore_form.cleaned_data
            recovery.record_restore_test(
                item=data["item"],
                backup=data["backup_report"],
                into=data["into"],
                started=data["started"],
                finished=data["finished"],
                verified=data["verified"],
                verification=data["verification"],
                by_user=request.user,
            )
            return redirect(reverse("recovery:item", args=[data["item"].pk]) + "#restore-tests")
        _require(request, RECOVERY_ADD)
        form = RecoveryItemForm(request.POST)
        if not form.is_valid():
            return self.render_to_response(self.get_context_data(form=form), status=400)
        item = form.save()
        return redirect("recovery:item", pk=item.pk)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        now = timezone.now()
        states = recovery.item_states()
        filters = RegisterFilterForm(self.request.GET or None)
        wanted = filters.cleaned_data if filters.is_valid() else {}
        rows = [row(s, now) for s in states]
        if wanted.get("kind"):
            rows = [r for r in rows if r["item"].kind == wanted["kind"]]
        if wanted.get("state"):
            state = wanted["state"]
            rows = [r for r in rows if (state in r["problems"] if state != "ok" else not r["problems"])]
        user = self.request.user
        context.update(
            rows=rows,
            counts=recovery.summary(states, now),
            filters=filters,
            filtered=bool(wanted.get("kind") or wanted.get("state")),
            may_add=user.has_perm(RECOVERY_ADD),
            may_test=user.has_perm(RESTORE_TEST_ADD),
            defaults=defaults_text(),
        )
        context.setdefault("form", RecoveryItemForm())
        context.setdefault("restore_form", RestoreTestForm(initial={"item": self.request.GET.get("test")}))
        return context


class ItemView(RecoveryRequiredMixin, TemplateView):
    """One item: its figures, its edit form, its latest backup reports and every restore test."""

    template_name = "recovery/item.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        _require(request, RECOVERY_CHANGE)
        item = get_object_or_404(RecoveryItem, pk=kwargs["pk"])
        form = RecoveryItemForm(request.POST, instance=item)
        if not form.is_valid():
            return self.render_to_response(self.get_context_data(form=form), status=400)
        form.save()
        return redirect("recovery:item", pk=item.pk)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        item = get_object_or_404(
            RecoveryItem.objects.select_related("source_site", "copy_site", "dataset", "job"), pk=self.kwargs["pk"]
        )
        now = timezone.now()
        (state,) = recovery.item_states([item])
        context.update(
            item=item,
            r=row(state, now),
            backups=item.backups.select_related("copy_site")[:BACKUPS_SHOWN],
            backup_count=item.backups.count(),
            tests=item.restore_tests.select_related("by_user", "backup"),
            may_change=self.request.user.has_perm(RECOVERY_CHANGE),
            may_test=self.request.user.has_perm(RESTORE_TEST_ADD),
            defaults=defaults_text(),
        )
        if "form" not in context:
            # a fresh form for the stored item (a rejected one carries the rejected values)
            context["form"] = RecoveryItemForm(instance=RecoveryItem.objects.get(pk=item.pk))
        return context
