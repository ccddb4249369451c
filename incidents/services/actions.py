"""The incident actions beyond the lifecycle: reopen, change severity, merge, silence from an
incident, and a postmortem drafted from the timeline.

Same shape as the transitions in ``engine``: keyword-only arguments, one transaction, a
conditional UPDATE whose row count says whether the action still applies (TransitionError, a 409,
when someone moved the incident first), a timeline entry with actor and time, pushes on commit.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from incidents.choices import IncidentState, Severity, TimelineKind
from incidents.models import ActionItem, Finding, Incident, Silence, TimelineEntry
from incidents.services.engine import (
    Actor,
    TransitionError,
    _after_commit,
    _record,
    affected_gpus,
    audit_change,
    gpus_out_of_service,
    worse,
)
from incidents.services.matchers import LABEL_NAME, matches_all
from incidents.services.silences import create_silence


def reopen_incident(incident: Incident, *, actor: Actor, note: str = "") -> Incident:
    """Move a resolved incident back to triggered (a merged one stays closed: reopen its target)."""
    with transaction.atomic():
        before = {"state": IncidentState.RESOLVED, "resolved_at": incident.resolved_at, "auto_resolve_at": None}
        claimed = Incident.objects.filter(
            pk=incident.pk, state=IncidentState.RESOLVED, merged_into__isnull=True
        ).update(state=IncidentState.TRIGGERED, resolved_at=None, auto_resolve_at=None)
        if not claimed:
            raise TransitionError(f"Incident #{incident.pk} is not a resolved incident that can be reopened.")
        incident.refresh_from_db()
        text = f"Reopened by {actor.label}" + (f": {note}" if note else "")
        _record(incident, TimelineKind.STATE, text, actor)
        audit_change(incident, before, text)
        _after_commit(incident.pk)
    return incident


def change_severity(incident: Incident, *, severity: str, actor: Actor, note: str = "") -> Incident:
    """Set the severity by hand; the timeline records from what to what. ``incident.severity`` is
    what the person saw: if it changed meanwhile, TransitionError."""
    new = Severity(severity)
    old = incident.severity
    if new == old:
        raise ValueError(f"Incident #{incident.pk} is already {new}.")
    with transaction.atomic():
        claimed = Incident.objects.filter(pk=incident.pk, severity=old, merged_into__isnull=True).update(severity=new)
        if not claimed:
            raise TransitionError(f"Incident #{incident.pk} changed meanwhile; reload and try again.")
        incident.refresh_from_db()
        text = f"Severity changed from {old} to {new} by {actor.label}" + (f": {note}" if note else "")
        _record(incident, TimelineKind.STATE, text, actor, severity_from=old, severity_to=new)
        audit_change(incident, {"severity": old}, text)
        _after_commit(incident.pk)
    return incident


def merge_incidents(source: Incident, *, into: Incident, actor: Actor) -> Incident:
    """Fold ``source`` into ``into`` (the target, which stays): returns the target.

    1. Lock both rows in id order (two merges crossing cannot deadlock).
    2. Claim the source: not merged already; it is closed as resolved with a link to the target.
    3. Move its findings and action items; copy its timeline onto the target (entries are
       append-only, so the source keeps its own and the copies say where they came from).
    4. The target takes the worse severity, the earlier start, the labels both share, and
       cancels a pending auto-resolve if a moved finding still fires.
    """
    if source.pk == into.pk:
        raise ValueError("An incident cannot be merged into itself.")
    now = timezone.now()
    with transaction.atomic():
        rows = {
            i.pk: i for i in Incident.objects.select_for_update().filter(pk__in=[source.pk, into.pk]).order_by("pk")
        }
        target = rows[into.pk]
        if target.merged_into_id is not None:
            raise TransitionError(f"Incident #{into.pk} was itself merged; merge into #{target.merged_into_id}.")
        source = rows[source.pk]
        if not target.is_open and source.findings.firing().exists():
            # Its live faults would go quiet under a closed incident: nobody would see them.
            raise TransitionError(
                f"Incident #{into.pk} is resolved and #{source.pk} still has firing findings; "
                f"reopen #{into.pk} first, or merge the other way."
            )
        # A source that was open closes now; one already resolved keeps its own resolution time
        # (and acknowledgement), so the merge does not move anything's MTTR or MTTA.
        closing: dict[str, Any] = {"resolved_at": now} if source.is_open else {}
        claimed = Incident.objects.filter(pk=source.pk, merged_into__isnull=True).update(
            merged_into=target, state=IncidentState.RESOLVED, auto_resolve_at=None, **closing
        )
        if not claimed:
            raise TransitionError(f"Incident #{source.pk} was already merged.")
        if source.is_open:
            Incident.objects.filter(pk=source.pk, acknowledged_at__isnull=True).update(acknowledged_at=now)
        source_before = {
            "merged_into": None,
            "state": source.state,
            "auto_resolve_at": source.auto_resolve_at,
            "resolved_at": source.resolved_at,
            "acknowledged_at": source.acknowledged_at,
        }
        audit_change(Incident.objects.get(pk=source.pk), source_before, f"Merged into #{target.pk} by {actor.label}")
        moved = Finding.objects.filter(incident=source).update(incident=target)
        ActionItem.objects.filter(incident=source).update(incident=target)
        TimelineEntry.objects.bulk_create(
            TimelineEntry(
                incident=target,
                at=entry.at,
                kind=entry.kind,
                actor_id=entry.actor_id,
                actor_label=entry.actor_label,
                text=f"[from #{source.pk}] {entry.text}",
                data={**entry.data, "merged_from": source.pk},
            )
            for entry in source.timeline.order_by("at", "id")
        )
        updates: dict[str, Any] = {
            "severity": worse(target.severity, source.severity),
            "started_at": min(target.started_at, source.started_at),
            "labels": {k: v for k, v in target.labels.items() if source.labels.get(k) == v},
            "affected_gpus": affected_gpus(target),
            "gpus_out_of_service": gpus_out_of_service(target),
            # Both incidents' findings reported their costs into their own sums: now one incident.
            "gpu_hours_lost": target.gpu_hours_lost + source.gpu_hours_lost,
        }
        if target.findings.firing().exists():
            updates["auto_resolve_at"] = None
        target_before = {k: getattr(target, k) for k in updates}
        Incident.objects.filter(pk=target.pk).update(**updates)
        audit_change(Incident.objects.get(pk=target.pk), target_before, f"#{source.pk} merged in by {actor.label}")
        _record(
            source,
            TimelineKind.STATE,
            f"Merged into #{target.pk} by {actor.label}; closed",
            actor,
            merged_into=target.pk,
        )
        _record(
            target,
            TimelineKind.STATE,
            f"Incident #{source.pk} ({source.title}) merged into this one by {actor.label}: {moved} finding(s) moved",
            actor,
            merged_from=source.pk,
        )
        _after_commit(source.pk)
        _after_commit(target.pk)
        target.refresh_from_db()
    return target


# --- silencing from an incident ---------------------------------------------------------------


def silence_matchers_for(incident: Incident) -> list[dict[str, str]]:
    """Matchers that describe this incident: one ``=`` per label its findings share (the detector
    label included, when one detector raised them all)."""
    return [
        {"name": name, "op": "=", "value": str(value)}
        for name, value in sorted(incident.labels.items())
        if LABEL_NAME.match(name) and value not in (None, "")
    ]


# A silence must name the thing that is broken. Matchers on none of these (e.g. only the site a
# merged incident's findings share) would mute every fault of a whole site or detector.
SPECIFIC_LABELS = frozenset({"gpu", "hostname", "node", "job", "endpoint"})


def is_specific(matchers: list[dict[str, str]]) -> bool:
    return any(m["name"] in SPECIFIC_LABELS for m in matchers)


def silence_incident(
    incident: Incident,
    *,
    matchers: list[dict[str, str]],
    hours: float,
    comment: str,
    actor: Actor,
    starts_at: datetime | None = None,
) -> Silence:
    """Create a silence from an incident and note it on the incident's timeline, both or neither.

    Matchers must be validated already; raises DuplicateSilence as ``create_silence`` does.
    """
    starts_at = starts_at or timezone.now()
    with transaction.atomic():
        silence = create_silence(
            matchers=matchers,
            starts_at=starts_at,
            ends_at=starts_at + timedelta(hours=hours),
            comment=comment,
            created_by=actor.user,
        )
        _record(
            incident,
            TimelineKind.NOTE,
            f"Silenced {silence} until {silence.ends_at:%Y-%m-%d %H:%M} UTC: {silence.comment}",
            actor,
            silence=silence.pk,
        )
        _after_commit(incident.pk)
    return silence


def silence_preview(matchers: list[dict[str, str]], *, limit: int = 200) -> list[Finding]:
    """The findings firing now that a silence with these matchers would match."""
    firing = Finding.objects.firing().select_related("incident").order_by("-last_seen")
    return [f for f in firing.iterator(chunk_size=500) if matches_all(matchers, f.labels)][:limit]


# --- postmortem ----------------------------------------------------------------------------------


def _stamp(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment else "–"


def postmortem_draft(incident: Incident) -> dict[str, str]:
    """A postmortem template filled from what the console knows: times, impact and the timeline."""
    lines = [
        f"{entry.at:%Y-%m-%d %H:%M:%S} {entry.actor_label}: {entry.text}"
        for entry in incident.timeline.exclude(kind=TimelineKind.POSTMORTEM).order_by("at", "id")
    ]
    duration = incident.duration
    minutes = int(duration.total_seconds() // 60)
    return {
        "pm_summary": (
            f"{incident.severity} {incident.title}. Fault began {_stamp(incident.started_at)}, detected "
            f"{_stamp(incident.detected_at)}, acknowledged {_stamp(incident.acknowledged_at)}, resolved "
            f"{_stamp(incident.resolved_at)} ({minutes} min)."
        ),
        "pm_impact": (
            f"{incident.affected_gpus} GPU(s) affected; {incident.current_gpu_hours():.2f} GPU-hours lost"
            + (
                f"; {incident.error_budget_burned:.3f} of the error budget burned"
                if incident.error_budget_burned
                else ""
            )
            + ". Affected: "
            + (", ".join(f"{k}={v}" for k, v in sorted(incident.labels.items())) or "–")
        ),
        "pm_root_cause": "What failed, and why? (fill in)",
        "pm_timeline": "\n".join(lines),
        "pm_went_well": "",
        "pm_went_badly": "",
    }


def draft_postmortem(incident: Incident, *, actor: Actor) -> Incident:
    """Fill the postmortem's empty fields from the template; never overwrites what people wrote."""
    draft = postmortem_draft(incident)
    with transaction.atomic():
        incident = Incident.objects.select_for_update().get(pk=incident.pk)
        changed = {k: v for k, v in draft.items() if v and not getattr(incident, k).strip()}
        if not changed:
            return incident
        before = {k: getattr(incident, k) for k in changed}
        Incident.objects.filter(pk=incident.pk).update(**changed)
        incident.refresh_from_db()
        names = ", ".join(k.removeprefix("pm_").replace("_", " ") for k in changed)
        audit_change(incident, before, f"Postmortem drafted from the timeline ({names})")
        _record(
            incident,
            TimelineKind.POSTMORTEM,
            f"Postmortem drafted from the timeline ({names})",
            actor,
            fields=sorted(changed),
        )
        _after_commit(incident.pk)
    return incident


__all__ = [
    "change_severity",
    "draft_postmortem",
    "is_specific",
    "merge_incidents",
    "postmortem_draft",
    "reopen_incident",
    "silence_incident",
    "silence_matchers_for",
    "silence_preview",
]
