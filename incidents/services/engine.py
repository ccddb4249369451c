"""The incident engine: findings in, incidents out.

* ``raise_finding`` / ``clear_finding`` are the only way faults enter: detectors and the
  Alertmanager receiver both call them. The same fingerprint updates the same finding; related
  findings (same group key, e.g. the same node or job) join one open incident within a window.
* State changes are atomic claims: a conditional UPDATE ... WHERE state IN (allowed) and a row
  count check, so two operators (or two workers) cannot both move the same incident.
* Every change writes a timeline entry with actor and time; notifications and live pushes are
  scheduled after commit.
* Cause and effect: one cause, one incident, every job it hit. A finding may name the finding that
  caused it, by fingerprint, in ``impact["caused_by"]`` (a hung job's finding names the link flap
  under it; a data stall could name the starving mount's finding the same way). The engine knows
  nothing of fabrics or jobs: an effect joins the open incident holding its cause, or gathers with
  the cause's other effects under the group key ``cause=<fingerprint>`` until the cause is raised
  and joins them (whichever the detectors report first). ``impact["effect"]`` ({"headline",
  "name", "detail"}) titles the incident after its effects ("Fabric fault → job hang: job-a,
  job-b (link flap on ...)"), and each effect's GPU-hours add to it like any joining finding's.
  Who names the cause is the room that knows both sides (fleet.correlation); a finding already
  in an incident when its cause is first named stays there.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max
from django.utils import timezone

from console import live
from console.signals import row_changed
from incidents.choices import (
    OPEN_STATES,
    SEVERITY_RANK,
    FindingStatus,
    IncidentRole,
    IncidentState,
    Severity,
    TimelineKind,
)
from incidents.models import ActionItem, Finding, Incident, Silence, TimelineEntry
from incidents.notifications.routing import notify
from incidents.services.cost import count_affected_gpus, out_of_service, reported_gpu_hours

logger = logging.getLogger(__name__)

# Labels that say "the same thing is broken", most specific first: findings sharing the first
# one present group into one incident.
GROUP_LABELS = ("job", "endpoint", "hostname", "node")


class TransitionError(Exception):
    """The incident is not in a state that allows this change (someone else moved it first?)."""


@dataclass(frozen=True)
class Actor:
    """Who did something: a person, or a named system part (a detector, alertmanager).

    ``ref`` pins a non-person down where its label may be ambiguous (token names need not be
    unique): it goes into the timeline entry's data as ``actor_ref``.
    """

    label: str
    user: Any = None
    ref: str = ""

    @classmethod
    def person(cls, user: Any) -> Actor:
        return cls(label=user.get_username(), user=user)

    @classmethod
    def system(cls, name: str) -> Actor:
        return cls(label=name)


SYSTEM = Actor.system("system")


def default_group_key(labels: dict[str, Any], fingerprint: str) -> str:
    for name in GROUP_LABELS:
        if labels.get(name):
            key = "node" if name == "hostname" else name
            return f"{key}={labels[name]}"
    return f"fingerprint={fingerprint}"


def worse(a: str, b: str) -> str:
    return a if SEVERITY_RANK[Severity(a)] <= SEVERITY_RANK[Severity(b)] else b


def _record(
    incident: Incident, kind: str, text: str, actor: Actor, *, at: datetime | None = None, **data: Any
) -> TimelineEntry:
    if actor.ref:
        data["actor_ref"] = actor.ref
    return TimelineEntry.objects.create(
        incident=incident,
        kind=kind,
        text=text,
        actor=actor.user,
        actor_label=actor.label,
        at=at or timezone.now(),
        data=data,
    )


def _after_commit(incident_id: int, event: str | None = None) -> None:
    def run() -> None:
        live.request_push("incidents")
        if event:
            notify(incident_id, event)

    transaction.on_commit(run)


def _lock_group(group_key: str) -> None:
    """Serialise incident creation per group: two findings of one node arriving together must
    not open two incidents."""
    digest = int.from_bytes(hashlib.blake2b(group_key.encode(), digest_size=8).digest(), "big", signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [digest])


def active_silence(labels: dict[str, Any], at: datetime | None = None) -> Silence | None:
    for silence in Silence.objects.active(at):
        if silence.matches(labels):
            return silence
    return None


def raise_finding(
    fingerprint: str,
    labels: dict[str, Any],
    severity: str,
    summary: str,
    description: str = "",
    impact: dict[str, Any] | None = None,
    *,
    source: str = "api",
    group_key: str | None = None,
    started_at: datetime | None = None,
    category: str = "",
    actor: Actor | None = None,
) -> Finding:
    """Report that a fault is present. Idempotent: repeating it changes nothing but last_seen.

    ``actor`` is who the timeline names (default: the source); Alertmanager's names its token.

    1. Upsert the finding by fingerprint (a repeat only refreshes it; a worse severity escalates).
    2. A finding matched by an active silence is recorded and goes no further.
    3. Otherwise it joins the open incident of its group (within the window) or opens one.
    """
    now = timezone.now()
    impact = impact or {}
    actor = actor or Actor.system(source)
    with transaction.atomic():
        finding = Finding.objects.select_for_update().filter(fingerprint=fingerprint).first()
        if finding is not None and finding.status == FindingStatus.FIRING:
            return _repeat(
                finding,
                severity=severity,
                summary=summary,
                impact=impact,
                now=now,
                actor=actor,
                group_key=group_key,
                category=category or source,
            )
        if finding is None:
            try:
                with transaction.atomic():
                    finding = Finding.objects.create(
                        fingerprint=fingerprint,
                        source=source,
                        labels=labels,
                        severity=severity,
                        summary=summary[:500],
                        description=description,
                        impact=impact,
                        started_at=started_at or now,
                    )
            except IntegrityError:  # raised at the same moment elsewhere: take theirs
                finding = Finding.objects.select_for_update().get(fingerprint=fingerprint)
                return _repeat(
                    finding,
                    severity=severity,
                    summary=summary,
                    impact=impact,
                    now=now,
                    actor=actor,
                    group_key=group_key,
                    category=category or source,
                )
        else:  # fired before, cleared, and fires again
            finding.status, finding.cleared_at, finding.incident = FindingStatus.FIRING, None, None
            finding.labels, finding.severity, finding.summary = labels, severity, summary[:500]
            finding.description, finding.impact = description, impact
            finding.started_at, finding.last_seen, finding.times_seen = started_at or now, now, finding.times_seen + 1
        silence = active_silence(labels, now)
        finding.silenced_by = silence
        if silence is not None:
            finding.save()
            logger.info("finding %s silenced by silence %s", fingerprint, silence.pk)
            return finding
        from incidents.services.maintenance import active_maintenance

        finding.in_maintenance = active_maintenance(labels, now)
        if finding.in_maintenance is not None:  # recorded and shown, but no incident, no page
            finding.save()
            return finding
        _open_or_join(finding, group_key=group_key, category=category or source, now=now, actor=actor)
        return finding


def _open_or_join(finding: Finding, *, group_key: str | None, category: str, now: datetime, actor: Actor) -> None:
    """Route a firing finding that is neither silenced nor in maintenance: it joins the open
    incident of its group (within the window) or opens one. Saves the finding. Called under the
    finding's row lock, by a first raise and by a repeat whose silence or window has ended."""
    labels, fingerprint, severity, summary = finding.labels, finding.fingerprint, finding.severity, finding.summary
    impact = finding.impact or {}
    window = now - timedelta(seconds=settings.INCIDENT_GROUP_WINDOW_SECONDS)
    incident, key = _cause_incident(finding, window)
    key = key or group_key or default_group_key(labels, fingerprint)
    _lock_group(key)
    incident = incident or (
        Incident.objects.select_for_update()
        .filter(group_key=key, state__in=OPEN_STATES, detected_at__gte=window)
        .order_by("-detected_at")
        .first()
    )
    if incident is None:
        incident = Incident.objects.create(
            title=summary[:300],
            severity=severity,
            group_key=key,
            labels=labels,
            category=category,
            started_at=finding.started_at,
            detected_at=now,
            affected_gpus=count_affected_gpus([(fingerprint, impact)]),
            gpus_out_of_service=out_of_service([(fingerprint, impact)]),
            gpu_hours_lost=reported_gpu_hours(impact),
            error_budget_burned=float(impact.get("error_budget", 0)),
        )
        finding.incident = incident
        finding.save()
        _record(
            incident,
            TimelineKind.STATE,
            f"Triggered ({severity}) by {actor.label}: {summary}",
            actor,
            fingerprint=fingerprint,
            labels=labels,
        )
        _after_commit(incident.pk, "triggered")
        return
    finding.incident = incident
    finding.save()
    _join(incident, finding, actor=actor, now=now)


def caused_by(finding: Finding) -> str:
    """The fingerprint of the finding this one names as its cause (``impact["caused_by"]``)."""
    return str((finding.impact or {}).get("caused_by") or "")


def _cause_incident(finding: Finding, window: datetime) -> tuple[Incident | None, str]:
    """Cause and effect, one incident (see the module's docstring on ``caused_by``): the open
    incident this finding must join, and the group key it opens one under when there is none.

    * an effect (it names its cause) joins the open incident holding its cause; with none yet, it
      opens or joins one keyed ``cause=<the cause's fingerprint>``, where the other effects of that
      cause gather and where the cause joins them when it is raised;
    * any other finding first joins the open incident its own effects opened (``cause=<its
      fingerprint>``); else (None, "") and it groups as usual.
    """
    cause = caused_by(finding)
    key = f"cause={cause or finding.fingerprint}"
    _lock_group(key)
    if cause:
        holding = (
            Incident.objects.select_for_update()
            .filter(findings__fingerprint=cause, state__in=OPEN_STATES)
            .order_by("-detected_at")
            .first()
        )
        return holding, key
    waiting = (
        Incident.objects.select_for_update()
        .filter(group_key=key, state__in=OPEN_STATES, detected_at__gte=window)
        .order_by("-detected_at")
        .first()
    )
    return waiting, ""


def effect_title(incident: Incident) -> str:
    """The title of an incident whose effects joined their cause: the effects' headline and every
    effect's name (``impact["effect"]``: {"headline", "name", "detail"}), "Fabric fault → job hang:
    job-a, job-b (link flap on gpu-a-017 mlx5_0/1)". Empty when no finding of it is an effect."""
    effects = [
        e
        for e in incident.findings.order_by("started_at", "pk").values_list("impact__effect", flat=True)
        if isinstance(e, dict) and e.get("headline")
    ]
    return title_of_effects(effects)


def title_of_effects(effects: list[dict[str, Any]]) -> str:
    """effect_title's words for these effects (in order), "" for none."""
    if not effects:
        return ""
    names = list(dict.fromkeys(str(e.get("name", "")) for e in effects if e.get("name")))
    detail = f" ({effects[0]['detail']})" if effects[0].get("detail") else ""
    return f"{effects[0]['headline']}: {', '.join(names)}{detail}"


def _join(incident: Incident, finding: Finding, *, actor: Actor, now: datetime) -> None:
    updates: dict[str, Any] = {}
    if incident.auto_resolve_at is not None:
        updates["auto_resolve_at"] = None
    new_severity = worse(incident.severity, finding.severity)
    if new_severity != incident.severity:
        updates["severity"] = new_severity
    # Labels common to every finding describe the incident; the rest live on the findings.
    common = {k: v for k, v in incident.labels.items() if finding.labels.get(k) == v}
    if common != incident.labels:
        updates["labels"] = common
    updates["affected_gpus"] = affected_gpus(incident)
    updates["gpus_out_of_service"] = gpus_out_of_service(incident)
    updates["started_at"] = min(incident.started_at, finding.started_at)
    # The joining finding's own cost adds to the incident's (incidents.services.cost), as each
    # repeat raise adds what its figure grew by.
    updates["gpu_hours_lost"] = incident.gpu_hours_lost + reported_gpu_hours(finding.impact)
    # An incident opened by a symptom (an SLO burning) takes the title of the first cause that
    # joins it (the queueing collapse behind the burn): the on-call engineer reads the cause first.
    others = incident.findings.exclude(pk=finding.pk)
    if not is_symptom(finding) and not others.exclude(impact__has_key="symptom", impact__symptom=True).exists():
        updates["title"] = finding.summary[:300]
    # An effect joining its cause (or a cause its effects) names the cause and every effect hit.
    retitled_as_cause = "title" in updates
    if title := effect_title(incident):
        updates["title"] = title[:300]
    Incident.objects.filter(pk=incident.pk).update(**updates)
    text = f"Finding joined: {finding.summary}"
    if retitled_as_cause:
        text += "; the incident is retitled after it (it opened on a symptom, this names a cause)"
    elif "title" in updates:
        text += f"; the incident is retitled {updates['title']}"
    if "severity" in updates:
        text += f" (severity raised to {new_severity})"
    if "auto_resolve_at" in updates:
        text += "; auto-resolution cancelled"
    _record(incident, TimelineKind.FINDING, text, actor, fingerprint=finding.fingerprint, labels=finding.labels)
    _after_commit(incident.pk)


def is_symptom(finding: Finding) -> bool:
    """A symptom finding (``impact["symptom"]``: an SLO's error budget burning) says that users
    are hurt, not why; detectors that name a cause leave it unset."""
    return bool((finding.impact or {}).get("symptom"))


def affected_gpus(incident: Incident) -> int:
    """GPUs out of service in the incident, each counted once (see count_affected_gpus)."""
    return count_affected_gpus(incident.findings.values_list("fingerprint", "impact"))


def gpus_out_of_service(incident: Incident) -> int:
    """GPUs the incident's findings take out of service outside any job, each once
    (incidents.services.cost.out_of_service)."""
    return out_of_service(incident.findings.values_list("fingerprint", "impact"))


def _repeat(
    finding: Finding,
    *,
    severity: str,
    summary: str,
    impact: dict[str, Any],
    now: datetime,
    actor: Actor,
    group_key: str | None = None,
    category: str = "",
) -> Finding:
    Finding.objects.filter(pk=finding.pk).update(
        last_seen=now, times_seen=F("times_seen") + 1, impact=impact or finding.impact
    )
    incident = finding.incident
    if incident is None:
        # Held out by a silence or maintenance window when it first fired. Once neither holds it
        # any more it must page like any fault: route it now rather than leave it firing unseen.
        from incidents.services.maintenance import active_maintenance

        finding.refresh_from_db()
        finding.silenced_by = active_silence(finding.labels, now)
        finding.in_maintenance = None if finding.silenced_by else active_maintenance(finding.labels, now)
        if finding.silenced_by is not None or finding.in_maintenance is not None:
            finding.save(update_fields=["silenced_by", "in_maintenance"])
            return finding
        finding.severity = worse(finding.severity, severity)
        _open_or_join(finding, group_key=group_key, category=category or finding.source, now=now, actor=actor)
        finding.refresh_from_db()
        return finding
    if incident is not None and incident.is_open:
        escalated = worse(incident.severity, severity)
        if escalated != incident.severity:
            Incident.objects.filter(pk=incident.pk).update(severity=escalated)
            _record(
                incident,
                TimelineKind.FINDING,
                f"Severity raised to {escalated}: {summary}",
                actor,
                fingerprint=finding.fingerprint,
            )
            _after_commit(incident.pk)
        # The finding's own figure moved (a hang held longer, a failed job still waiting): the
        # incident's sum moves by as much. Under the finding's row lock, so deltas never interleave.
        delta = reported_gpu_hours(impact) - reported_gpu_hours(finding.impact) if impact else 0.0
        if delta:
            Incident.objects.filter(pk=incident.pk).update(gpu_hours_lost=F("gpu_hours_lost") + delta)
        if impact and out_of_service([("", impact)]) != out_of_service([("", finding.impact)]):
            Incident.objects.filter(pk=incident.pk).update(gpus_out_of_service=gpus_out_of_service(incident))
    finding.refresh_from_db()
    return finding


def clear_finding(
    fingerprint: str, *, source: str = "api", at: datetime | None = None, actor: Actor | None = None
) -> Finding | None:
    """Report that a fault is gone. Idempotent. When an incident's last finding clears:
    untouched by people, it resolves after the hold-down; taken by someone, people resolve it.
    ``actor`` is who the timeline names (default: the source); ``at`` when the fault was seen gone.

    A finding that fires and clears more than FINDING_FLAP_LIMIT times within
    FINDING_FLAP_WINDOW_SECONDS is flapping: it is held firing on its incident (so it neither
    resolves nor pages again each time it returns) until it has stayed away for the window.
    """
    now = at or timezone.now()
    actor = actor or Actor.system(source)
    with transaction.atomic():
        finding = Finding.objects.select_for_update().filter(fingerprint=fingerprint).first()
        if finding is None or finding.status != FindingStatus.FIRING:
            return finding
        if _held_flapping(finding, now=now, actor=actor):
            return finding
        finding.status, finding.cleared_at = FindingStatus.CLEARED, now
        finding.save(update_fields=["status", "cleared_at", "flap_clears", "flapping_since"])
        incident = finding.incident
        if incident is None or not incident.is_open:
            return finding
        incident = Incident.objects.select_for_update().get(pk=incident.pk)
        _record(incident, TimelineKind.FINDING, f"Finding cleared: {finding.summary}", actor, fingerprint=fingerprint)
        if not incident.findings.firing().exists():
            if incident.state == IncidentState.TRIGGERED:
                hold = timedelta(seconds=settings.INCIDENT_HOLD_DOWN_SECONDS)
                Incident.objects.filter(pk=incident.pk).update(auto_resolve_at=now + hold)
                _record(
                    incident,
                    TimelineKind.STATE,
                    f"All findings cleared; resolves automatically at {(now + hold):%H:%M:%S} UTC "
                    "unless one fires again",
                    actor,
                )
            else:
                _record(
                    incident,
                    TimelineKind.STATE,
                    "All findings cleared; the incident stays open until a person resolves it",
                    actor,
                )
        _after_commit(incident.pk)
    return finding


def _held_flapping(finding: Finding, *, now: datetime, actor: Actor) -> bool:
    """Count this clear; return True where the finding is (or now becomes) held as flapping.

    Called under the finding's row lock. A held finding is released (and clears) once nothing
    raised it for the flap window; its clears are counted afresh from then.
    """
    window = timedelta(seconds=settings.FINDING_FLAP_WINDOW_SECONDS)
    incident = finding.incident
    if finding.flapping_since is not None:
        if now - finding.last_seen < window:
            return True
        finding.flapping_since, finding.flap_clears = None, []
        if incident is not None and incident.is_open:
            _record(
                incident,
                TimelineKind.FINDING,
                f"Stopped flapping: not seen for {window.total_seconds() / 60:.0f} min: {finding.summary}",
                actor,
                fingerprint=finding.fingerprint,
            )
        return False
    finding.flap_clears = [t for t in finding.flap_clears if now - t < window] + [now]
    if len(finding.flap_clears) <= settings.FINDING_FLAP_LIMIT:
        return False
    finding.flapping_since = now
    finding.save(update_fields=["flap_clears", "flapping_since"])
    if incident is not None:
        _record(
            incident,
            TimelineKind.FINDING,
            f"Flapping: fired and cleared {len(finding.flap_clears)} times in "
            f"{window.total_seconds() / 60:.0f} min; held firing on this incident until it stays away "
            f"that long: {finding.summary}",
            actor,
            fingerprint=finding.fingerprint,
            flapping=True,
        )
        _after_commit(incident.pk)
    return True


def _stop_flapping(finding: Finding, *, why: str, actor: Actor) -> None:
    """Clear a held (flapping) finding as of when it was last seen. Called under its row lock."""
    finding.status, finding.cleared_at = FindingStatus.CLEARED, finding.last_seen
    finding.flapping_since, finding.flap_clears = None, []
    finding.save(update_fields=["status", "cleared_at", "flapping_since", "flap_clears"])
    if finding.incident_id is not None:
        _record(
            finding.incident, TimelineKind.FINDING, f"{why}: {finding.summary}", actor, fingerprint=finding.fingerprint
        )


def release_stale_flapping(*, now: datetime | None = None) -> list[int]:
    """Clear held (flapping) findings nothing raised for the flap window.

    A held finding is otherwise released only by its next clear, which a fault that simply went
    away never sends: it would hold its incident open for ever. An incident left with no firing
    finding, untouched by people, becomes due to auto-resolve now (the fault ended long before
    the hold-down); one people took stays open until they resolve it, as in ``clear_finding``.
    """
    now = now or timezone.now()
    window = timedelta(seconds=settings.FINDING_FLAP_WINDOW_SECONDS)
    stale = Finding.objects.filter(
        status=FindingStatus.FIRING, flapping_since__isnull=False, last_seen__lt=now - window
    ).values_list("pk", flat=True)
    released = []
    for pk in list(stale):
        with transaction.atomic():
            finding = (
                Finding.objects.select_for_update()
                .filter(pk=pk, status=FindingStatus.FIRING, flapping_since__isnull=False, last_seen__lt=now - window)
                .first()
            )
            if finding is None:
                continue  # raised or cleared meanwhile
            _stop_flapping(
                finding, why=f"Stopped flapping: not seen for {window.total_seconds() / 60:.0f} min", actor=SYSTEM
            )
            released.append(pk)
            incident = finding.incident
            if incident is None or not incident.is_open or incident.findings.firing().exists():
                continue
            if incident.state == IncidentState.TRIGGERED:
                Incident.objects.filter(pk=incident.pk, state=IncidentState.TRIGGERED).update(auto_resolve_at=now)
            else:
                _record(
                    incident,
                    TimelineKind.STATE,
                    "All findings cleared; the incident stays open until a person resolves it",
                    SYSTEM,
                )
            _after_commit(incident.pk)
    return released


def auto_resolve_due(*, now: datetime | None = None) -> list[int]:
    """Resolve untouched incidents whose findings stayed cleared through the hold-down.

    The incident is resolved as of its last finding's clearing, the moment the fault ended: the
    hold-down is our caution, not part of the time to recover (MTTR).
    """
    now = now or timezone.now()
    release_stale_flapping(now=now)
    resolved = []
    due = Incident.objects.filter(state=IncidentState.TRIGGERED, auto_resolve_at__lte=now).values_list("pk", flat=True)
    for pk in list(due):
        with transaction.atomic():
            if Finding.objects.filter(incident_id=pk, status=FindingStatus.FIRING).exists():
                continue
            # When its last finding cleared (never before it was detected: a reopened incident).
            ended = Finding.objects.filter(incident_id=pk).aggregate(t=Max("cleared_at"))["t"] or now
            detected = Incident.objects.filter(pk=pk).values_list("detected_at", flat=True).first() or now
            claimed = Incident.objects.filter(pk=pk, state=IncidentState.TRIGGERED, auto_resolve_at__lte=now).update(
                state=IncidentState.RESOLVED, resolved_at=min(max(ended, detected), now), auto_resolve_at=None
            )
            if not claimed:
                continue  # a person acted, or another worker resolved it
            incident = Incident.objects.get(pk=pk)
            _record(
                incident,
                TimelineKind.STATE,
                f"Auto-resolved: healthy for the {settings.INCIDENT_HOLD_DOWN_SECONDS} s hold-down",
                SYSTEM,
            )
            _after_commit(pk, "resolved")
            resolved.append(pk)
    return resolved


# --- what people do ---------------------------------------------------------------------------

_TRANSITIONS = {
    IncidentState.ACKNOWLEDGED: ((IncidentState.TRIGGERED,), "acknowledged_at", "Acknowledged"),
    IncidentState.MITIGATED: ((IncidentState.TRIGGERED, IncidentState.ACKNOWLEDGED), "mitigated_at", "Mitigated"),
    IncidentState.RESOLVED: (OPEN_STATES, "resolved_at", "Resolved"),
}


def _transition(incident: Incident, to: str, *, actor: Actor, note: str = "") -> Incident:
    allowed, stamp, verb = _TRANSITIONS[IncidentState(to)]
    now = timezone.now()
    with transaction.atomic():
        updates: dict[str, Any] = {"state": to, stamp: now, "auto_resolve_at": None}
        # The row as it was, for the audit log (the UPDATE below is what decides the race).
        before = Incident.objects.select_for_update().filter(pk=incident.pk).values(*updates, "acknowledged_at").first()
        claimed = Incident.objects.filter(pk=incident.pk, state__in=allowed).update(**updates)
        if not claimed:
            current = Incident.objects.filter(pk=incident.pk).values_list("state", flat=True).first()
            raise TransitionError(f"Cannot move incident #{incident.pk} from {current} to {to}.")
        # Acknowledging is implied by mitigating or resolving: keep MTTA honest.
        Incident.objects.filter(pk=incident.pk, acknowledged_at__isnull=True).update(acknowledged_at=now)
        incident.refresh_from_db()
        message = f"{verb} by {actor.label}" + (f": {note}" if note else "")
        _record(incident, TimelineKind.STATE, message, actor)
        audit_change(incident, before or {}, message)
        _after_commit(incident.pk, to if to in (IncidentState.ACKNOWLEDGED, IncidentState.RESOLVED) else None)
    return incident


def audit_change(incident: Incident, before: dict[str, Any], message: str) -> None:
    """Tell the audit log what a conditional UPDATE of ``incident`` (refreshed) changed: the
    fields' values ``before`` it (console.signals.row_changed; an UPDATE sends no post_save)."""
    row_changed.send(sender=Incident, instance=incident, before=before, message=message)


def acknowledge_incident(incident: Incident, *, actor: Actor, note: str = "") -> Incident:
    return _transition(incident, IncidentState.ACKNOWLEDGED, actor=actor, note=note)


def mitigate_incident(incident: Incident, *, actor: Actor, note: str = "") -> Incident:
    return _transition(incident, IncidentState.MITIGATED, actor=actor, note=note)


def resolve_incident(incident: Incident, *, actor: Actor, note: str = "") -> Incident:
    """Resolve; findings held firing as flapping clear with it (else they would hold on to a
    closed incident, and their next raise would not page)."""
    with transaction.atomic():
        incident = _transition(incident, IncidentState.RESOLVED, actor=actor, note=note)
        held = Finding.objects.select_for_update().filter(
            incident=incident, status=FindingStatus.FIRING, flapping_since__isnull=False
        )
        for finding in held:
            _stop_flapping(finding, why=f"Flapping finding cleared on resolution by {actor.label}", actor=actor)
    return incident


def assign_role(incident: Incident, *, role: str, user: Any, actor: Actor) -> Incident:
    field = IncidentRole(role).value
    with transaction.atomic():
        before = {field: getattr(incident, f"{field}_id")}
        Incident.objects.filter(pk=incident.pk).update(**{field: user})
        incident.refresh_from_db()
        who = user.get_username() if user else "nobody"
        audit_change(incident, before, f"{IncidentRole(role).label}: {who}")
        _record(
            incident,
            TimelineKind.ROLE,
            f"{IncidentRole(role).label}: {who}",
            actor,
            role=role,
            user=user.pk if user else None,
        )
        _after_commit(incident.pk)
    return incident


def add_note(incident: Incident, *, text: str, actor: Actor) -> TimelineEntry:
    with transaction.atomic():
        entry = _record(incident, TimelineKind.NOTE, text, actor)
        _after_commit(incident.pk)
    return entry


POSTMORTEM_FIELDS = ("pm_summary", "pm_impact", "pm_root_cause", "pm_timeline", "pm_went_well", "pm_went_badly")


def save_postmortem(incident: Incident, *, actor: Actor, **fields: str) -> Incident:
    changed = {k: v for k, v in fields.items() if k in POSTMORTEM_FIELDS and getattr(incident, k) != v}
    if not changed:
        return incident
    with transaction.atomic():
        before = {k: getattr(incident, k) for k in changed}
        Incident.objects.filter(pk=incident.pk).update(**changed)
        incident.refresh_from_db()
        names = ", ".join(k.removeprefix("pm_").replace("_", " ") for k in changed)
        _record(incident, TimelineKind.POSTMORTEM, f"Postmortem edited ({names})", actor, fields=sorted(changed))
        audit_change(incident, before, f"Postmortem edited ({names})")
    return incident


def add_action_item(
    incident: Incident, *, title: str, owner: Any = None, due_date: Any = None, actor: Actor
) -> ActionItem:
    with transaction.atomic():
        item = ActionItem.objects.create(incident=incident, title=title, owner=owner, due_date=due_date)
        _record(incident, TimelineKind.ACTION_ITEM, f"Action item added: {title}", actor, item=item.pk)
    return item


def update_action_item(item: ActionItem, *, actor: Actor, **fields: Any) -> ActionItem:
    allowed = {k: v for k, v in fields.items() if k in ("title", "owner", "due_date", "state")}
    with transaction.atomic():
        for name, value in allowed.items():
            setattr(item, name, value)
        item.save()
        described = ", ".join(f"{k}={getattr(v, 'username', v)}" for k, v in allowed.items())
        _record(
            item.incident,
            TimelineKind.ACTION_ITEM,
            f"Action item '{item.title}' updated: {described}",
            actor,
            item=item.pk,
        )
    return item
