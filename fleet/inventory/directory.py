"""Which site each GPU and node belongs to, and each GPU's id, cached in-process.

The ingest edge checks a batch's site scope and the writer maps UUIDs to ids on every batch; a
database round trip for each (1,000 UUIDs a batch, 100 batches a second) would cost more than
the COPY itself. Entries expire after a few minutes so a GPU moved between sites is seen soon.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from fleet.inventory.models import Gpu, Node

TTL_SECONDS = 300
MAX_ENTRIES = 200_000


class Entries:
    """key -> (object id, site id), all forgotten together TTL_SECONDS after the first was kept.

    One age for the lot, not one an entry: a lookup is then two set operations and a mapping in
    C, where a check of each key's own expiry was a Python step per UUID, on every batch, at the
    edge and in the writer. No entry is older than TTL_SECONDS either way."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[int, int]] = {}
        self.born = 0.0

    def current(self) -> dict[str, tuple[int, int]]:
        if self.items and time.monotonic() - self.born > TTL_SECONDS:
            self.items = {}
        return self.items

    def clear(self) -> None:
        self.items = {}


_gpus = Entries()  # by GPU UUID
_nodes = Entries()  # by hostname

# A node's ports and mounts, as the node series writer maps them: (kind, node id) -> ({name:
# what the writer needs of it}, expires). Shorter-lived than the GPUs' entries: a port an
# Operator deletes in another process is forgotten here within a minute.
PARTS_TTL_SECONDS = 60
_parts: dict[tuple[str, int], tuple[dict[str, Any], float]] = {}


def clear() -> None:
    _gpus.clear()
    _nodes.clear()
    _parts.clear()


def node_parts(kind: str, node_ids: Iterable[int]) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """The cached parts (``kind``: interface, mount) of these nodes, and the nodes not cached."""
    now = time.monotonic()
    hits: dict[int, dict[str, Any]] = {}
    misses: set[int] = set()
    for node_id in node_ids:
        entry = _parts.get((kind, node_id))
        if entry is not None and entry[1] > now:
            hits[node_id] = entry[0]
        else:
            misses.add(node_id)
    return hits, misses


def remember_node_parts(kind: str, by_node: dict[int, dict[str, Any]]) -> None:
    """Cache what a read found, once the caller's transaction commits (a rollback of rows it
    wrote would otherwise leave ids that never existed)."""
    transaction.on_commit(lambda: _remember_parts(kind, by_node))


def _remember_parts(kind: str, by_node: dict[int, dict[str, Any]]) -> None:
    if len(_parts) > MAX_ENTRIES:
        _parts.clear()
    expires = time.monotonic() + PARTS_TTL_SECONDS
    for node_id, parts in by_node.items():
        _parts[(kind, node_id)] = (parts, expires)


def forget_node_parts(kind: str, node_ids: Iterable[int]) -> None:
    for node_id in node_ids:
        _parts.pop((kind, node_id), None)


def _fresh(cache: Entries, keys: set[str]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    items = cache.current()
    found = keys & items.keys()
    return dict(zip(found, map(items.__getitem__, found), strict=True)), list(keys - found)


def _remember(cache: Entries, rows: Iterable[tuple[str, int, int]]) -> None:
    items = cache.current()
    if len(items) > MAX_ENTRIES:
        items = cache.items = {}
    if not items:
        cache.born = time.monotonic()
    items.update((key, (obj_id, site_id)) for key, obj_id, site_id in rows)


def gpus(uuids: Iterable[str], *, remember: bool = True) -> dict[str, tuple[int, int]]:
    """uuid -> (gpu id, site id) for the GPUs that exist.

    ``remember=False`` for rows this transaction may have just written: a rollback would leave
    the cache pointing at ids that never existed.
    """
    hits, misses = _fresh(_gpus, set(uuids))
    if misses:
        rows = list(Gpu.objects.filter(uuid__in=misses).values_list("uuid", "id", "node__site_id"))
        if remember:
            _remember(_gpus, rows)
        hits.update({u: (i, s) for u, i, s in rows})
    return hits


def nodes(hostnames: Iterable[str], *, remember: bool = True) -> dict[str, tuple[int, int]]:
    """hostname -> (node id, site id) for the nodes that exist (``remember`` as for gpus)."""
    hits, misses = _fresh(_nodes, set(hostnames))
    if misses:
        rows = list(Node.objects.filter(hostname__in=misses).values_list("hostname", "id", "site_id"))
        if remember:
            _remember(_nodes, rows)
        hits.update({h: (i, s) for h, i, s in rows})
    return hits


def forget(*, uuids: Iterable[str] = (), hostnames: Iterable[str] = ()) -> None:
    """Drop these entries, so the next lookup reads them from the database (a GPU or node that
    seems to be another site's may have been moved there since it was cached)."""
    for uuid in uuids:
        _gpus.items.pop(uuid, None)
    for hostname in hostnames:
        _nodes.items.pop(hostname, None)
