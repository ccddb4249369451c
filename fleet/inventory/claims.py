"""Claims of a GPU UUID or hostname across sites.

The first site whose token sends a GPU UUID or a hostname registers it (fleet.telemetry.store). When
another site's token later sends the same one, either the hardware moved, or a token sends
another site's names by mistake (or on purpose). Neither is for the ingest door to decide: the
sighting is recorded as a ClaimConflict, the claimant's samples that carry the value are held
back (not written; the door answers 409 naming it), the rest of its batch is written, and an Admin
resolves the claim (``resolve``). node_exporter's series (fabric and storage ports, mounts and
disks) are sighted once a push at the door too (fleet.ingest.prometheus.check_node_scope), which
answers 409 when they were all the push held and otherwise 202 naming the hosts held back; the
writer sights them again for a node registered elsewhere meanwhile
(fleet.telemetry.series.claim_foreign_nodes).

- **kept**: the value stays with its owner; the claimant's samples carrying it stay refused (403)
  for as long as the owner holds it;
- **moved**: the node (a hostname claim) moves to the claimant's site, out of its rack, or the GPU
  (a UUID claim, with its MIG instances) moves to the claimant's node of the hostname it last sent
  it under. From then on the claimant's samples are written and the owner's are the ones held.

Every resolution is audited (the conflict's change, and the node's or GPU's), and names who did it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import connection, transaction
from django.utils import timezone

from console.signals import row_changed
from fleet.choices import ClaimKind, ClaimResolution
from fleet.inventory import directory
from fleet.inventory.models import ClaimConflict, Gpu, Node, Site


class ClaimError(Exception):
    """A resolution refused by the current state (HTTP 409 / an admin error message)."""


@dataclass(frozen=True)
class Sighting:
    """A value a claimant sent that belongs to another site."""

    kind: str
    value: str
    owner_site_id: int
    claimant_hostname: str = ""


@dataclass(frozen=True)
class Held:
    """Why one value's samples are held back: its claim, pending or kept with the owner."""

    kind: str
    value: str
    conflict_id: int
    owner: str
    pending: bool

    def as_dict(self) -> dict[str, Any]:
        what = "GPU" if self.kind == ClaimKind.UUID else "node"
        if self.pending:
            detail = (
                f"{what} {self.value} belongs to site {self.owner}; this site's claim to it is pending Admin "
                "resolution (its samples are held back, not written)."
            )
        else:
            detail = f"{what} {self.value} belongs to site {self.owner}; an Admin kept it there."
        return {
            "field": "gpu_uuid" if self.kind == ClaimKind.UUID else "hostname",
            "value": self.value,
            "conflict": self.conflict_id,
            "state": "pending" if self.pending else "kept",
            "detail": detail,
        }


def sighted(claimant_site_id: int, sightings: Iterable[Sighting]) -> dict[tuple[str, str], Held]:
    """Record the claimant's sightings of other sites' values; (kind, value) -> Held.

    A value already kept with the same owner for this claimant is held without a new record; any
    other sighting opens the claimant's pending claim or adds to it (count, last seen) in one
    statement, safe against a twin request doing the same.
    """
    sightings = sorted(set(sightings), key=lambda s: (s.kind, s.value))
    if not sightings:
        return {}
    sites = dict(Site.objects.filter(pk__in={s.owner_site_id for s in sightings}).values_list("pk", "name"))
    kept = {
        (kind, value, owner): pk
        for pk, kind, value, owner in ClaimConflict.objects.filter(
            claimant_site_id=claimant_site_id,
            resolution=ClaimResolution.KEPT,
            value__in={s.value for s in sightings},
        ).values_list("pk", "kind", "value", "owner_site_id")
    }
    out: dict[tuple[str, str], Held] = {}
    rows = []
    for s in sightings:
        kept_id = kept.get((s.kind, s.value, s.owner_site_id))
        if kept_id is not None:
            out[s.kind, s.value] = Held(s.kind, s.value, kept_id, sites.get(s.owner_site_id, "?"), pending=False)
        else:
            rows.append(s)
    if rows:
        now = timezone.now()
        with connection.cursor() as cursor:
            table = ClaimConflict._meta.db_table
            cursor.execute(
                f"INSERT INTO {table} (kind, value, owner_site_id, claimant_site_id, claimant_hostname, "
                "first_seen, last_seen, count, resolution) "
                "SELECT k, v, o, %s, h, %s, %s, 1, '' FROM unnest(%s::text[], %s::text[], %s::int8[], %s::text[]) "
                "AS c(k, v, o, h) ORDER BY k, v "
                "ON CONFLICT (kind, value, claimant_site_id) WHERE resolved_at IS NULL DO UPDATE SET "
                f"last_seen = EXCLUDED.last_seen, count = {table}.count + 1, owner_site_id = EXCLUDED.owner_site_id, "
                f"claimant_hostname = COALESCE(NULLIF(EXCLUDED.claimant_hostname, ''), {table}.claimant_hostname) "
                "RETURNING id, kind, value, owner_site_id",
                [
                    claimant_site_id,
                    now,
                    now,
                    [s.kind for s in rows],
                    [s.value for s in rows],
                    [s.owner_site_id for s in rows],
                    [s.claimant_hostname for s in rows],
                ],
            )
            for pk, kind, value, owner in cursor.fetchall():
                out[kind, value] = Held(kind, value, pk, sites.get(owner, "?"), pending=True)
    return out


def owner_now(kind: str, value: str) -> int | None:
    """The site the value belongs to now (read from the database, not the directory's cache)."""
    if kind == ClaimKind.HOSTNAME:
        return Node.objects.filter(hostname=value).values_list("site_id", flat=True).first()
    return Gpu.objects.filter(uuid=value).values_list("node__site_id", flat=True).first()


def resolve(conflict: ClaimConflict, *, resolution: str, actor: Any) -> ClaimConflict:
    """Resolve a pending claim: keep the value with its owner, or move it to the claimant.

    1. Lock the claim; refuse one already resolved, or whose value changed owner meanwhile.
    2. Moved: move the node (hostname) or the GPU and its MIG instances (UUID), saved one by one
       so each move is audited.
    3. Mark the claim resolved with a conditional UPDATE; audit it; a move also resolves the
       claimant's other pending claims it settled (the GPUs of a moved node).
    4. After commit, forget this process's cached directory (others expire within its TTL).
    """
    if resolution not in (ClaimResolution.KEPT, ClaimResolution.MOVED):
        raise ClaimError(f"Unknown resolution {resolution!r}.")
    with transaction.atomic():
        current = (
            ClaimConflict.objects.select_for_update().select_related("owner_site", "claimant_site").get(pk=conflict.pk)
        )
        if current.resolved_at is not None:
            raise ClaimError(f"The claim is {current.get_resolution_display().lower()} already.")
        owner = owner_now(current.kind, current.value)
        if owner != current.owner_site_id:
            raise ClaimError(f"{current.value} no longer belongs to site {current.owner_site}; reload the list.")
        if resolution == ClaimResolution.MOVED:
            _move(current)
        settled = [current]
        if resolution == ClaimResolution.MOVED:
            settled += [
                other
                for other in ClaimConflict.objects.pending()
                .select_for_update()
                .filter(claimant_site_id=current.claimant_site_id)
                .exclude(pk=current.pk)
                if owner_now(other.kind, other.value) == current.claimant_site_id
            ]
        now = timezone.now()
        user = actor if getattr(actor, "pk", None) else None
        for claim in settled:
            moved = ClaimConflict.objects.filter(pk=claim.pk, resolved_at__isnull=True).update(
                resolution=resolution, resolved_by=user, resolved_at=now
            )
            if moved != 1:
                raise ClaimError("The claim changed meanwhile; reload the list.")
            claim.refresh_from_db()
            message = f"{claim.get_resolution_display()}: {claim.get_kind_display()} {claim.value}."
            row_changed.send(
                sender=ClaimConflict,
                instance=claim,
                before={"resolution": ClaimResolution.PENDING, "resolved_by": None, "resolved_at": None},
                message=message,
            )
            if user is not None:
                LogEntry.objects.log_actions(  # type: ignore[attr-defined]
                    user_id=user.pk, queryset=[claim], action_flag=CHANGE, change_message=message
                )
        transaction.on_commit(directory.clear)
    return settled[0]


def _move(claim: ClaimConflict) -> None:
    claimant = claim.claimant_site
    if claim.kind == ClaimKind.HOSTNAME:
        node = Node.objects.select_for_update().get(hostname=claim.value)
        node.site = claimant
        node.rack = None  # the rack is the owner site's
        node.save(update_fields=["site", "rack"])
        return
    gpu = Gpu.objects.select_for_update().select_related("node").get(uuid=claim.value)
    hostname = claim.claimant_hostname
    if not hostname:
        raise ClaimError(f"No hostname is known for {claim.value} at site {claimant}; it cannot be moved.")
    target = Node.objects.filter(hostname=hostname).first()
    if target is None:
        target = Node.objects.create(site=claimant, hostname=hostname)
    elif target.site_id != claimant.pk:
        raise ClaimError(
            f"The node {hostname} belongs to site {target.site}, not {claimant}: resolve the claim on its "
            "hostname first."
        )
    for moving in [gpu, *Gpu.objects.select_for_update().filter(parent=gpu).order_by("pk")]:
        moving.node = target
        moving.save(update_fields=["node"])
