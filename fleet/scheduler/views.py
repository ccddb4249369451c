"""The scheduler queues page: each queue with the pool and team it stands for (and the ones its
names suggest), and the quota drift between the scheduler and the console's team quotas.

Any role reads. POST ``action``:

- ``map`` (``id``, ``pool``, ``team``; empty: unmapped) and ``accept`` (``id``: take the
  suggested pool and team): Operators and Admins (fleet.change_schedulerqueue);
- ``import`` (``id``): the scheduler's GPU quota into the team's TeamQuota, an Admin or a
  Capacity approver (the console's quota rule, fleet.capacity.actions.approvals).

Every change goes through fleet.scheduler.mapping or fleet.scheduler.drift (audited on save).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from fleet.capacity.actions import approvals
from fleet.capacity.models import Pool, Team
from fleet.choices import TEAM_ONLY_KINDS
from fleet.scheduler import drift, mapping
from fleet.scheduler.models import SchedulerQueue

MAP_PERMISSION = "fleet.change_schedulerqueue"


def overview_tile(request: HttpRequest) -> dict[str, Any]:
    """The overview's scheduler tile: queues known and mapped, and those whose quota drifts."""
    mapped = drift.quota_drift()
    return {
        # The queues a pool can be set on: a LocalQueue or an account is never "mapped" in this sense.
        "queues": SchedulerQueue.objects.exclude(name="").exclude(kind__in=TEAM_ONLY_KINDS).count(),
        "mapped": len(mapped),
        "drifted": [d for d in mapped if d.drifted],
    }


class SchedulerQueuesView(DashboardRequiredMixin, TemplateView):
    template_name = "scheduler/queues.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        may_map = request.user.has_perm(MAP_PERMISSION)
        may_import = approvals.may_change_quota(request.user)
        if not (may_map or may_import):
            raise PermissionDenied(
                "Mapping a queue needs an Operator; importing a quota, an Admin or a Capacity approver."
            )
        action = request.POST.get("action", "")
        pk = request.POST.get("id", "")
        if action not in ("map", "accept", "import") or not pk.isdigit():
            return self._refuse({"detail": "Unknown action."}, 400)
        queue = get_object_or_404(SchedulerQueue.objects.select_related("site", "pool", "team"), pk=int(pk))
        if action == "import":
            return self._import(request, queue)
        if not may_map:
            raise PermissionDenied("Mapping a queue to a pool and team needs an Operator or an Admin.")
        if action == "accept":
            found = mapping.suggestions([queue])[queue.pk]
            changes: dict[str, Pool | Team | None] = {
                k: v for k, v in (("pool", found.pool), ("team", found.team)) if v is not None
            }
        else:
            try:
                changes = self._chosen(request, queue)
            except mapping.MappingRefused as exc:
                return self._refuse({"queue": queue, **exc.detail}, 400)
        try:
            mapping.set_mapping(queue, changes=changes)
        except mapping.MappingRefused as exc:
            return self._refuse({"queue": queue, **exc.detail}, 400)
        messages.success(
            request, f"Mapped {queue.name or '(cluster)'}: pool {queue.pool or '–'}, team {queue.team or '–'}."
        )
        return redirect("scheduler:queues")

    def _chosen(self, request: HttpRequest, queue: SchedulerQueue) -> dict[str, Pool | Team | None]:
        pool_id = request.POST.get("pool", "")
        team_name = request.POST.get("team", "")
        pool = None
        if pool_id:
            pool = Pool.objects.filter(pk=int(pool_id)).first() if pool_id.isdigit() else None
            if pool is None:
                raise mapping.MappingRefused("pool", f"No pool {pool_id}.")
        team = None
        if team_name:
            team = Team.objects.filter(name=team_name).first()
            if team is None:
                raise mapping.MappingRefused("team", f"No team named {team_name}.")
        return {"pool": pool, "team": team}

    def _import(self, request: HttpRequest, queue: SchedulerQueue) -> HttpResponse:
        try:
            quota = drift.import_quota(queue, actor=request.user)
        except approvals.ApprovalRefused as exc:
            return self._refuse({"queue": queue, **exc.detail}, 403)
        except drift.ImportRefused as exc:
            return self._refuse({"queue": queue, "fields": exc.detail}, 409 if exc.conflict else 400)
        messages.success(request, f"Imported the scheduler's quota: {quota}.")
        return redirect("scheduler:queues")

    def _refuse(self, refusal: dict[str, Any], code: int) -> HttpResponse:
        return self.render_to_response(self.get_context_data(refusal=refusal), status=code)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        user = self.request.user
        queues = list(SchedulerQueue.objects.select_related("site", "pool", "team"))
        found = mapping.suggestions(queues)
        pools = list(Pool.objects.select_related("site"))
        rows = []
        for q in queues:
            s = found[q.pk]
            rows.append(
                {
                    "queue": q,
                    "suggested_pool": s.pool,
                    "suggested_team": s.team,
                    # Offer the suggestion where it would change something.
                    "can_accept": (s.pool is not None and s.pool.pk != q.pool_id)
                    or (s.team is not None and s.team.pk != q.team_id),
                    "pools": [p for p in pools if p.site_id == q.site_id] if q.takes_pool else [],
                }
            )
        drifts = drift.quota_drift()
        context.update(
            rows=rows,
            teams=list(Team.objects.all()),
            drifts=drifts,
            drifted=[d for d in drifts if d.drifted],
            can_map=user.has_perm(MAP_PERMISSION),
            can_import=approvals.may_change_quota(user),
            resource=drift.GPU_RESOURCE,
        )
        return context
