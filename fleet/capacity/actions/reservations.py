"""Reservation commands: request, change, approve and cancel a reservation, and the beat's state
changes. Each runs in one transaction, moves the row with a conditional UPDATE (ConflictError, HTTP
409, when its state moved meanwhile), writes its audit entry and sends ``row_changed``. Who may do
what is fleet.capacity.actions.approvals' to say (ApprovalRefused, HTTP 403); what the pool can
supply, fleet.capacity.read.supply's."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import Any, TypeVar

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db import IntegrityError, transaction
from django.utils import timezone

from console.signals import row_changed
from fleet.capacity import quotas
from fleet.capacity.actions.approvals import APPROVE_RESERVATION, ConflictError, check_approver, check_editor
from fleet.capacity.models import COMMITTED_STATES, Pool, Reservation, ReservationState, TeamQuota
from fleet.capacity.read.supply import supply_curves
from fleet.choices import PriorityTier

# An instant in a sweep: a datetime, or (in the plan) integer microseconds since the epoch.
Instant = TypeVar("Instant", datetime, int)


def _sweep_events(
    reservations: Iterable[tuple[str, int, Instant, Instant]],
) -> list[tuple[Instant, int, str, int]]:
    """(time, order, team, delta) sorted; at one instant ends (order 0) come before starts (1),
    since a window is [start, end). Times are datetimes, or epoch microseconds (the plan's)."""
    events = []
    for team, gpus, start, end in reservations:
        events.append((start, 1, team, gpus))
        events.append((end, 0, team, -gpus))
    events.sort()
    return events


def first_overcommit(
    committed: list[tuple[str, int, datetime, datetime]],
    new: tuple[str, int, datetime, datetime],
    supply_steps: list[tuple[datetime, int]],
) -> tuple[datetime, datetime, list[str], int, int] | None:
    """The first interval inside the new reservation's window where committed demand plus it
    exceeds supply: (start, end, teams holding capacity in it, demand, supply), or None.

    A sweep over reservation boundaries and supply steps, O(n log n) in the reservations."""
    _, _, w_start, w_end = new
    events = _sweep_events([*committed, new])
    supply_times = [t for t, _ in supply_steps]

    def supply(t: datetime) -> int:
        i = bisect.bisect_right(supply_times, t) - 1
        return supply_steps[max(i, 0)][1]

    points = sorted({t for t, *_ in events} | {t for t in supply_times if w_start < t < w_end} | {w_start})
    demand = 0
    holders: dict[str, int] = defaultdict(int)
    ei = 0
    over: tuple[datetime, list[str], int, int] | None = None
    for i, t in enumerate(points):
        while ei < len(events) and events[ei][0] <= t:
            _, _, who, delta = events[ei]
            demand += delta
            holders[who] += delta
            ei += 1
        if t >= w_end:
            break
        nxt = points[i + 1] if i + 1 < len(points) else w_end
        if nxt <= w_start:
            continue
        s = supply(t)
        if demand > s:
            teams = sorted(k for k, v in holders.items() if v > 0)
            if over is None:
                over = (max(t, w_start), teams, demand, s)
            else:
                over = (over[0], sorted(set(over[1]) | set(teams)), max(over[2], demand), min(over[3], s))
        elif over is not None:
            return over[0], t, over[1], over[2], over[3]
    if over is not None:
        return over[0], w_end, over[1], over[2], over[3]
    return None


def quota_decision(
    pool: Pool,
    *,
    team: str,
    gpus: int,
    start: datetime,
    end: datetime,
    tier: str,
    priority: int = 0,
    exclude: int | None = None,
) -> quotas.Decision | None:
    """Kueue's admission of a request on the pool (fleet.capacity.quotas) against the committed
    reservations overlapping its window, every tier counted; None on a pool without quotas (first
    come, first served within supply). ``exclude``: the request itself, if stored."""
    team_quotas = {
        t: quotas.Quota(n, b, lend)
        for t, n, b, lend in TeamQuota.objects.filter(pool=pool).values_list(
            "team_id", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"
        )
    }
    if not team_quotas:
        return None
    held = [
        quotas.Held(*row)
        for row in Reservation.objects.committed()
        .filter(pool=pool)
        .overlapping(start, end)
        .exclude(pk=exclude)
        .values_list("pk", "team_id", "gpus", "start", "end", "tier", "priority", "approved_at")
    ]
    request = quotas.Request(team, gpus, start, end, tier, priority, pool=str(pool))
    return quotas.decide(request, team_quotas, held, pool.reclaim_within_cohort)


def _quota_refusal(decision: quotas.Decision) -> ConflictError:
    """The 409 of a refusal by quota: the reason on ``gpus``, with what would fit and the figures."""
    return ConflictError(
        "Refused by the team's quota.", gpus=decision.reason, fits=decision.fits, quota=decision.figures
    )


def _log(actor: Any, reservation: Reservation, flag: int, message: str) -> None:
    if actor is None or not getattr(actor, "pk", None):
        return  # an agent token: the reservation names it in requested_via
    LogEntry.objects.log_actions(  # type: ignore[attr-defined]
        user_id=actor.pk, queryset=[reservation], action_flag=flag, change_message=message
    )


# What a repeat of a create must match to be the same request (client_id_scope's idempotency).
REPEAT_FIELDS = ("team", "pool", "gpus", "start", "end", "tier", "priority", "note")


def client_id_scope(*, site_id: int | None = None, user_id: int | None = None) -> str:
    """Whose client ids a sender's are among: an agent token's site's, or the person's."""
    return f"site:{site_id}" if site_id is not None else f"user:{user_id}"


def create_reservation(*, actor: Any, via: str, scope: str = "", **values: Any) -> tuple[Reservation, bool]:
    """Record a reservation request (state requested): (reservation, created).

    A client id is unique within ``scope`` (client_id_scope: the token's site, or the person), so
    no sender reaches or squats another's. A repeat with the same fields returns the first one
    unchanged; a repeat that differs is a ConflictError naming the fields that differ. A request
    the team's quota refuses now (fleet.capacity.quotas: it would not fit even by reclaiming) raises
    ConflictError naming what would fit; approval checks again, with supply, since others may
    commit meanwhile.
    """
    client_id = values.get("client_id")
    if client_id is None:
        with transaction.atomic():
            return _create(actor, via, "", values), True
    try:
        with transaction.atomic():
            existing = Reservation.objects.filter(client_scope=scope, client_id=client_id).first()
            if existing is None:
                return _create(actor, via, scope, values), True
    except IntegrityError:  # a twin request committed the id meanwhile: compare with it
        existing = Reservation.objects.get(client_scope=scope, client_id=client_id)
    differing = [f for f in REPEAT_FIELDS if f in values and values[f] != getattr(existing, f)]
    if differing:
        raise ConflictError(
            f"client_id {client_id!r} was used for another request; {', '.join(differing)} differ.",
            client_id=client_id,
            fields=differing,
            reservation=existing.pk,
        )
    return existing, False


def _check_quota(values: dict[str, Any], *, exclude: int | None = None) -> None:
    """A request's check at the door (a create, or a change of what a requested one asks for):
    ConflictError naming what would fit when the team's quota refuses it now. Supply is checked
    at approval, when it is committed."""
    team = values["team"]
    decision = quota_decision(
        values["pool"],
        team=getattr(team, "name", team),
        gpus=values["gpus"],
        start=values["start"],
        end=values["end"],
        tier=values.get("tier", PriorityTier.RESERVED),
        priority=values.get("priority", 0),
        exclude=exclude,
    )
    if decision is not None and not decision.admitted:
        raise _quota_refusal(decision)


def _create(actor: Any, via: str, scope: str, values: dict[str, Any]) -> Reservation:
    _check_quota(values)
    reservation = Reservation.objects.create(
        created_by=actor if getattr(actor, "pk", None) else None, requested_via=via, client_scope=scope, **values
    )
    _log(actor, reservation, ADDITION, f"Requested {reservation.gpus} GPUs ({reservation.tier}).")
    return reservation


# What a request asks for: a change of one re-runs creation's quota check and, once approved,
# needs approving again.
ASKED_FIELDS = ("team", "pool", "gpus", "start", "end", "tier", "priority")


def update_reservation(reservation: Reservation, *, actor: Any, changes: dict[str, Any]) -> Reservation:
    """Change a reservation's fields (the API's PATCH, the page's change form), or raise
    ApprovalRefused (HTTP 403) or ConflictError (HTTP 409); nothing is stored on a refusal.

    1. Lock the pool the reservation is to be on, as approve does, and read the row again.
    2. Whatever its state, it is changed only by its requester or an Admin
       (fleet.capacity.actions.approvals.check_editor): otherwise an approver could rewrite someone
       else's request and approve it, or anyone could reorder an approved one (issue 37).
    3. A change of what it asks for (ASKED_FIELDS) re-runs creation's quota check, itself left
       out of the pool's use: 409 naming what would fit. An approved one goes back to requested
       (its approval cleared: someone else approves what it now asks for); an active or ended
       one is refused (409 naming the field): cancel it and request anew. Its note and client id
       change in any state without a new approval: they commit no capacity.
    4. A conditional UPDATE (409 when its state moved meanwhile), then the audit entry naming the
       fields, whether it went back to requested, and whether an Admin changed someone else's.
    """
    with transaction.atomic():
        target = changes.get("pool", reservation.pool)
        Pool.objects.select_for_update().only("pk").get(pk=getattr(target, "pk", target))
        current = Reservation.objects.select_for_update().get(pk=reservation.pk)
        by_admin = check_editor(actor, requester_id=current.created_by_id)
        changed = {k: v for k, v in changes.items() if getattr(current, k) != v}
        if not changed:
            return current
        asked = sorted(set(changed) & set(ASKED_FIELDS))
        if asked and current.state not in (ReservationState.REQUESTED, ReservationState.APPROVED):
            why = f"Cannot change once {current.state}; cancel it and request anew."
            raise ConflictError(why, **{asked[0]: why})
        if asked:
            _check_quota({k: changes.get(k, getattr(current, k)) for k in ASKED_FIELDS}, exclude=current.pk)
        before = {k: current._meta.get_field(k).value_from_object(current) for k in changed}
        updates = dict(changed)
        reapprove = bool(asked) and current.state == ReservationState.APPROVED
        if reapprove:
            approval = {"approved_by": None, "approved_at": None, "self_approved": False}
            before |= {k: current._meta.get_field(k).value_from_object(current) for k in ("state", *approval)}
            updates |= {"state": ReservationState.REQUESTED, **approval}
        moved = Reservation.objects.filter(pk=current.pk, state=current.state).update(
            **updates, updated_at=timezone.now()
        )
        if moved != 1:
            raise ConflictError("The reservation changed meanwhile; reload it.")
        approved_by = current.approved_by
        current.refresh_from_db()
        message = f"Changed {', '.join(sorted(changed))}."
        if reapprove:
            by = f" by {approved_by.get_username()}" if approved_by else ""
            message += f" Back to requested (it was approved{by}): what it asks for now needs approving again."
        if by_admin:
            message += " Changed by an Admin, not its requester."
        _log(actor, current, CHANGE, message)
        row_changed.send(
            sender=Reservation,
            instance=current,
            before=before,
            message=message,
        )
    return current


def approve(reservation: Reservation, *, actor: Any, now: datetime | None = None) -> Reservation:
    """Approve a requested reservation, or raise ConflictError (HTTP 409).

    1. Lock the pool row: approvals on one pool run one at a time, so two that would each fit
       alone but not together cannot both pass.
    2. Refuse an approver the separation-of-duties rules refuse (fleet.capacity.actions.approvals:
       ApprovalRefused, HTTP 403), then a reservation that is no longer requested (409).
    3. Ask the team's quota (fleet.capacity.quotas, every tier counted): admitted, admitted after
       reclaiming borrowed quota (the reservations to preempt), or refused.
    4. Refuse when, at some moment of its window, committed reservations plus this one exceed
       supply (naming the first such interval and the teams in it), the preempted ones left out:
       a firm reservation against energised supply and other firm ones (it may displace
       preemptible work), a preemptible one against installed GPUs and every committed one.
       Then refuse a quota refusal (field ``gpus``, with what would fit).
    5. Preempt the reclaimed reservations (each with its reason, an audit entry and, per borrower
       team, a SEV4 capacity incident), move this one with a conditional UPDATE (recording a
       self-approval), write the audit entry.
    """
    now = now or timezone.now()
    with transaction.atomic():
        pool = Pool.objects.select_for_update().select_related("site").get(pk=reservation.pool_id)
        current = Reservation.objects.get(pk=reservation.pk)
        # Separation of duties (fleet.capacity.actions.approvals): 403 before any state or supply check.
        self_approved = check_approver(
            actor, requester_id=current.created_by_id, permission=APPROVE_RESERVATION, what="reservation"
        )
        if current.state != ReservationState.REQUESTED:
            raise ConflictError(f"The reservation is {current.state}; only a requested one can be approved.")
        decision = quota_decision(
            pool,
            team=current.team_id,
            gpus=current.gpus,
            start=current.start,
            end=current.end,
            tier=current.tier,
            priority=current.priority,
            exclude=current.pk,
        )
        victims = decision.preempt if decision is not None else ()
        _check_supply(current, pool, leaving_out=victims, today=timezone.localdate(now, UTC))
        if decision is not None and not decision.admitted:
            raise _quota_refusal(decision)
        moved = Reservation.objects.filter(pk=current.pk, state=ReservationState.REQUESTED).update(
            state=ReservationState.APPROVED,
            approved_by=actor if getattr(actor, "pk", None) else None,
            approved_at=now,
            self_approved=self_approved,
        )
        if moved != 1:
            raise ConflictError("The reservation changed meanwhile; reload it.")
        current.refresh_from_db()
        current.pool = pool  # with its site, read above: the audit entry names both
        if victims:
            _preempt(victims, by=current, actor=actor, now=now)
        message = _approval_message(current, victims, self_approved=self_approved)
        _log(actor, current, CHANGE, message)
        row_changed.send(
            sender=Reservation,
            instance=current,
            before={
                "state": ReservationState.REQUESTED,
                "approved_by": None,
                "approved_at": None,
                "self_approved": False,
            },
            message=message,
        )
    return current


def _check_supply(current: Reservation, pool: Pool, *, leaving_out: Iterable[quotas.Held], today: date) -> None:
    """Approval's supply check (approve, step 4): ConflictError naming the first interval of the
    reservation's window where committed reservations plus it exceed supply, and the teams in it.
    A firm reservation counts against energised supply and the other firm ones (it may displace
    preemptible work); a preemptible one against installed GPUs and every committed one. The
    reservations its quota reclaims (``leaving_out``) are not counted."""
    preemptible = current.tier == PriorityTier.PREEMPTIBLE
    committed_rows = (
        Reservation.objects.committed()
        .filter(pool=pool)
        .overlapping(current.start, current.end)
        .exclude(pk__in=[v.id for v in leaving_out])
    )
    if not preemptible:
        committed_rows = committed_rows.exclude(tier=PriorityTier.PREEMPTIBLE)
    committed = list(committed_rows.values_list("team", "gpus", "start", "end"))
    new = (current.team_id, current.gpus, current.start, current.end)
    curve = supply_curves([pool], today=today)[pool.pk]
    conflict = first_overcommit(committed, new, curve.installed_steps() if preemptible else curve.steps())
    if conflict is None:
        return
    start, end, teams, demand, supply = conflict
    what = "installed" if preemptible else "energised"
    raise ConflictError(
        f"Over-commits the pool: {demand} GPUs reserved against {supply} {what} from "
        f"{start.isoformat()} to {end.isoformat()}.",
        conflict={
            "start": start.isoformat(),
            "end": end.isoformat(),
            "teams": teams,
            "demand": demand,
            "supply": supply,
        },
    )


def _approval_message(current: Reservation, victims: Iterable[quotas.Held], *, self_approved: bool) -> str:
    """The approval's audit entry: what was approved, what it reclaimed, whether it was self-approved."""
    message = f"Approved: {current.gpus} GPUs {current.start:%Y-%m-%d}..{current.end:%Y-%m-%d}."
    if victims:
        message += f" Reclaimed by preempting {', '.join(f'#{v.id}' for v in victims)}."
    if self_approved:
        message += " Self-approved by an Admin, its own requester."
    return message


def _preempt(victims: Iterable[quotas.Held], *, by: Reservation, actor: Any, now: datetime) -> list[Reservation]:
    """Preempt the reservations ``by`` reclaims (inside approve's transaction, pool locked): each
    moves to preempted with a conditional UPDATE (one that stopped holding capacity meanwhile is
    left alone) and its reason, and gets an audit entry; each borrower team is told by a SEV4
    incident of category ``capacity`` naming its reservations (incidents.services.engine)."""
    from incidents.choices import Severity
    from incidents.services.engine import Actor, raise_finding

    pool = by.pool
    reason = (
        f"Preempted: {by.team_id} reclaims its nominal quota on {pool} for reservation #{by.pk} "
        f"({by.gpus} GPUs {by.start:%Y-%m-%d %H:%M}..{by.end:%Y-%m-%d %H:%M} UTC); "
        f"the pool's reclaimWithinCohort is {pool.reclaim_within_cohort}."
    )
    ids = [v.id for v in victims]
    was = dict(
        Reservation.objects.select_for_update()
        .filter(pk__in=ids, state__in=COMMITTED_STATES)
        .values_list("pk", "state")
    )
    Reservation.objects.filter(pk__in=was, state__in=COMMITTED_STATES).update(
        state=ReservationState.PREEMPTED, preempted_at=now, preempted_by=by, preempted_reason=reason, updated_at=now
    )
    preempted = list(Reservation.objects.filter(pk__in=was).select_related("pool__site").order_by("pk"))
    by_team: dict[str, list[Reservation]] = defaultdict(list)
    for r in preempted:
        _log(actor, r, CHANGE, reason)
        row_changed.send(sender=Reservation, instance=r, before={"state": was[r.pk]}, message=reason)
        by_team[r.team_id].append(r)
    who = Actor.person(actor) if getattr(actor, "pk", None) else Actor.system("capacity")
    for team, rows in by_team.items():
        names = ", ".join(f"#{r.pk} ({r.gpus} GPUs, {r.tier})" for r in rows)
        raise_finding(
            f"capacity-reclaim:{by.pk}:{team}",
            {"site": pool.site.name, "pool": pool.name, "team": team, "reclaimed_by": by.team_id},
            Severity.SEV4,
            f"{team}: {len(rows)} reservation{'s' if len(rows) != 1 else ''} preempted on {pool} "
            f"({by.team_id} reclaims its quota)",
            f"{reason} Preempted reservations of {team}: {names}.",
            source="capacity",
            category="capacity",
            group_key=f"capacity-reclaim={by.pk}:{team}",
            actor=who,
        )
    return preempted


def cancel(reservation: Reservation, *, actor: Any) -> Reservation:
    """Cancel a requested, approved or active reservation (409 once expired or cancelled)."""
    with transaction.atomic():
        current = Reservation.objects.select_for_update().get(pk=reservation.pk)
        if current.state not in (ReservationState.REQUESTED, *COMMITTED_STATES):
            raise ConflictError(f"The reservation is {current.state}; it cannot be cancelled.")
        before = {"state": current.state}
        Reservation.objects.filter(pk=current.pk).update(state=ReservationState.CANCELLED, updated_at=timezone.now())
        current.refresh_from_db()
        _log(actor, current, CHANGE, "Cancelled.")
        row_changed.send(sender=Reservation, instance=current, before=before, message="Cancelled.")
    return current


def advance_states(now: datetime | None = None) -> dict[str, int]:
    """The beat task's work: approved -> active at start, approved/active -> expired at end;
    a request whose window has passed unapproved is cancelled. Conditional UPDATEs: safe to run
    anywhere, any number of times."""
    now = now or timezone.now()
    moves = {
        "expired": (Reservation.objects.committed().filter(end__lte=now), ReservationState.EXPIRED),
        "activated": (
            Reservation.objects.filter(state=ReservationState.APPROVED, start__lte=now, end__gt=now),
            ReservationState.ACTIVE,
        ),
        "lapsed": (
            Reservation.objects.filter(state=ReservationState.REQUESTED, end__lte=now),
            ReservationState.CANCELLED,
        ),
    }
    counts = {}
    for name, (due, to) in moves.items():
        with transaction.atomic():
            # Locked, then moved: the audit log gets each row's state before, and a second runner
            # skips the locked rows rather than moving them twice.
            was = dict(due.select_for_update(skip_locked=True).values_list("pk", "state"))
            counts[name] = Reservation.objects.filter(pk__in=was).update(state=to, updated_at=now)
            for reservation in Reservation.objects.filter(pk__in=was):
                before = {"state": was[reservation.pk]}
                row_changed.send(sender=Reservation, instance=reservation, before=before, message=name.title())
    return counts
