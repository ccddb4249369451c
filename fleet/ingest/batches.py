"""The edge of the GPU-sample ingest path: validate a whole batch fast, check its scope, enqueue it.

Validation uses msgspec (a compiled schema) because this is the highest-volume request in the
console; a bad batch is rejected whole with the index and field of the first fault.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import re
from datetime import datetime, timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.utils import timezone
from msgspec.structs import astuple

from fleet.choices import ClaimKind
from fleet.telemetry.fields import (
    GPU_SAMPLE_FIELDS,
    MIG_INSTANCE_FIELDS,
    GpuSampleIn,
    GpuSampleRow,
    hostname_of,
    parent_of,
    ts_of,
    uuid_of,
)
from fleet.validation import HOSTNAME_PATTERN, UUID_PATTERN, IngestError


class GpuBatchIn(msgspec.Struct, forbid_unknown_fields=True):
    samples: list[GpuSampleIn]  # type: ignore[valid-type]


_decoder = msgspec.json.Decoder(GpuBatchIn)
_PATH = re.compile(r"at `\$(?:\.(\w+))?(?:\[(\d+)\])?(?:\.(\w+))?`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def parse_gpu_batch(body: bytes, *, now: datetime | None = None) -> GpuBatchIn:
    """Decode and validate a GPU sample batch; raise IngestError (400/413) naming the fault."""
    if len(body) > settings.INGEST_MAX_BYTES:
        raise IngestError(413, f"Body is {len(body)} bytes; the limit is {settings.INGEST_MAX_BYTES} bytes.")
    if not body.strip():
        raise IngestError(400, 'Empty body: send a JSON object {"samples": [...]}.')
    try:
        batch = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise IngestError(400, f"Malformed JSON: {exc}") from None
    count = len(batch.samples)
    if count == 0:
        raise IngestError(400, "The batch has no samples.", field="samples")
    if count > settings.INGEST_MAX_ITEMS:
        raise IngestError(413, f"The batch has {count} samples; at most {settings.INGEST_MAX_ITEMS} per request.")
    _check_identities(batch.samples)
    _check_mig_instances(batch.samples)
    now = now or timezone.now()
    newest = now + timedelta(seconds=settings.INGEST_MAX_FUTURE_SECONDS)
    oldest = now - timedelta(seconds=settings.INGEST_MAX_AGE_SECONDS)
    # min/max run in C; the loop that names the sample only runs for a batch that is refused.
    # (NaN cannot reach here: it is not JSON, and msgspec refuses it as malformed.)
    stamps = list(map(ts_of, batch.samples))
    if max(stamps) > newest or min(stamps) < oldest:
        for index, ts in enumerate(stamps):
            if ts > newest:
                raise IngestError(
                    400,
                    f"samples[{index}].ts is {ts.isoformat()}, more than "
                    f"{settings.INGEST_MAX_FUTURE_SECONDS} s in the future (check the agent's clock).",
                    item=index,
                    field="ts",
                )
            if ts < oldest:
                raise IngestError(
                    400,
                    f"samples[{index}].ts is {ts.isoformat()}, older than the "
                    f"{settings.INGEST_MAX_AGE_SECONDS} s accepted.",
                    item=index,
                    field="ts",
                )
    return batch


# fullmatch, not match: "$" also matches before a trailing newline, and "gpu-1\n" is not a host.
_IDENTITIES = (
    ("gpu_uuid", re.compile(UUID_PATTERN.removeprefix("^").removesuffix("$"))),
    ("hostname", re.compile(HOSTNAME_PATTERN.removeprefix("^").removesuffix("$"))),
    ("parent_uuid", re.compile(UUID_PATTERN.removeprefix("^").removesuffix("$"))),
)


# Values that matched their pattern before (a fleet sends the same UUIDs and hostnames every few
# seconds): only new ones meet the regex. Bounded; cleared when full.
_matched: dict[str, set[str]] = {field: set() for field, _ in _IDENTITIES}
_MATCHED_MAX = 500_000


def _check_identities(samples: list[Any]) -> None:
    """The identity fields against their patterns, each distinct value once; the error names the
    first sample that carries a bad value, as msgspec would have."""
    for field, pattern in _IDENTITIES:
        values = set(map(operator.attrgetter(field), samples))
        values.discard(None)
        matched = _matched[field]
        new = values - matched
        if not new:
            continue
        bad = {v for v in new if not pattern.fullmatch(v)}
        if len(matched) > _MATCHED_MAX:
            matched.clear()
        matched.update(new - bad)
        if bad:
            index = next(i for i, s in enumerate(samples) if getattr(s, field) in bad)
            value = getattr(samples[index], field)
            raise IngestError(
                400,
                f"Invalid samples[{index}].{field}: {value!r} is not matching regex {pattern.pattern!r}",
                item=index,
                field=field,
            )


_DEVICE_ONLY_FIELDS = tuple(f.name for f in GPU_SAMPLE_FIELDS if f.name not in MIG_INSTANCE_FIELDS)


def _check_mig_instances(samples: list[Any]) -> None:
    """A MIG instance reports only what it has of its own (utilisation, memory, activity ratios):
    power, temperatures, clocks, energy, ECC and XIDs are the physical GPU's, reported on it."""
    if not any(map(parent_of, samples)):  # no MIG instances: the usual batch, checked in C
        return
    for index, sample in enumerate(samples):
        if sample.parent_uuid is None:
            continue
        for name in _DEVICE_ONLY_FIELDS:
            if getattr(sample, name) is not None:
                raise IngestError(
                    400,
                    f"samples[{index}].{name}: a MIG instance has no {name} of its own; report it on the "
                    f"physical GPU {sample.parent_uuid}.",
                    item=index,
                    field=name,
                )


def invalid_identity(sample: Any) -> str | None:
    """The first identity field of one sample that does not match its pattern, or None."""
    for field, pattern in _IDENTITIES:
        value = getattr(sample, field)
        if value is not None and not pattern.fullmatch(value):
            return field
    return None


def _validation_error(text: str) -> IngestError:
    """Turn msgspec's message (``... - at `$.samples[3].power_w```) into an item index and field."""
    item = field = None
    if match := _PATH.search(text):
        if match.group(2) is not None:
            item = int(match.group(2))
        field = match.group(3) or (match.group(1) if item is None else None)
    if match := (_UNKNOWN.search(text) or _MISSING.search(text)):
        field = match.group(1)
    location = (f"samples[{item}]" + (f".{field}" if field else "")) if item is not None else (field or "body")
    return IngestError(400, f"Invalid {location}: {text}", item=item, field=field)


def batch_key(*, site_id: int, body: bytes, idempotency_key: str | None) -> str:
    """The batch's idempotency key: the agent's Idempotency-Key header, else a hash of the body."""
    if idempotency_key:
        check_idempotency_key(idempotency_key)
        return f"{site_id}:k:{idempotency_key}"
    return f"{site_id}:h:{hashlib.sha256(body).hexdigest()}"


def check_idempotency_key(key: str) -> None:
    if len(key) > 200 or not key.isprintable():
        raise IngestError(400, "Idempotency-Key must be at most 200 printable characters.", field="Idempotency-Key")


@dataclasses.dataclass
class ScopeCheck:
    """What a site's batch may write: its samples less those held back by claims (claims.Held)."""

    samples: list[Any]
    held: list[Any] = dataclasses.field(default_factory=list)  # one claims.Held per value, in batch order
    first_held: int | None = None  # the index of the first sample held back
    first_field: str = ""  # and its field that named another site's GPU or node
    # The registered GPUs the batch names, uuid -> (id, site): the kept samples' ids, when all are.
    gpus: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def refusal(self) -> IngestError:
        """The answer for the held samples: 409 while a claim is pending, 403 once kept elsewhere."""
        first = self.held[0]
        pending = any(h.pending for h in self.held)
        where = f"samples[{self.first_held}]: " if self.first_held is not None else ""
        return IngestError(
            409 if pending else 403,
            f"{where}{first.as_dict()['detail']}",
            item=self.first_held,
            field=self.first_field,
        )

    def joined(self, other: ScopeCheck | None) -> ScopeCheck:
        """This check with ``other``'s held values after its own (the refusal still names this one's first)."""
        return self if other is None else dataclasses.replace(self, held=[*self.held, *other.held])


def _elsewhere(found: dict[str, tuple[int, int]], site_id: int) -> set[str]:
    """The keys of ``found`` (key -> (id, site)) registered under another site than ``site_id``."""
    if set(map(_site_of, found.values())) <= {site_id}:
        return set()
    return {key for key, (_, site) in found.items() if site != site_id}


_site_of = operator.itemgetter(1)


def check_site_scope(batch: GpuBatchIn, *, site_id: int) -> ScopeCheck:
    """Split a batch into what its site may write and what it may not.

    A GPU UUID (or a MIG instance's parent) or a hostname registered under another site is a
    claim (fleet.inventory.claims): recorded, and the samples that carry it held back, not
    written; the rest of the batch goes on. A MIG instance whose physical GPU is neither
    registered nor in the batch is refused (400: it would be stored as a physical GPU)."""
    from fleet.inventory import claims, directory

    samples = batch.samples
    parents = {s.parent_uuid for s in samples if s.parent_uuid} if any(map(parent_of, samples)) else set()
    uuids = set(map(uuid_of, samples)) | parents
    hostnames = set(map(hostname_of, samples))
    gpus = directory.gpus(uuids)
    nodes = directory.nodes(hostnames)
    # Sites counted in C first: the usual batch names only its own site's GPUs and nodes.
    foreign_gpus = _elsewhere(gpus, site_id)
    foreign_nodes = _elsewhere(nodes, site_id)
    if foreign_gpus or foreign_nodes:  # cached: read them again, in case they moved here since
        directory.forget(uuids=foreign_gpus, hostnames=foreign_nodes)
        gpus.update(directory.gpus(foreign_gpus))
        nodes.update(directory.nodes(foreign_nodes))
        foreign_gpus = {uuid for uuid in foreign_gpus if uuid in gpus and gpus[uuid][1] != site_id}
        foreign_nodes = {host for host in foreign_nodes if host in nodes and nodes[host][1] != site_id}
    orphans = (parents - set(gpus) - {s.gpu_uuid for s in samples if not s.parent_uuid}) if parents else set()
    for index, sample in enumerate(samples if orphans else ()):  # name the first offending sample
        if sample.parent_uuid in orphans:
            raise IngestError(
                400,
                f"samples[{index}]: the physical GPU {sample.parent_uuid} of this MIG instance is not registered; "
                "send a sample of it in the same batch.",
                item=index,
                field="parent_uuid",
            )
    if not foreign_gpus and not foreign_nodes:
        return ScopeCheck(samples=samples, gpus=gpus)
    sightings: dict[tuple[str, str], claims.Sighting] = {}
    first_held, first_field = None, ""
    kept = []
    for index, sample in enumerate(samples):
        found = [
            (name, ClaimKind.UUID, value)
            for name, value in (("gpu_uuid", sample.gpu_uuid), ("parent_uuid", sample.parent_uuid))
            if value in foreign_gpus
        ]
        if sample.hostname in foreign_nodes:
            found.append(("hostname", ClaimKind.HOSTNAME, sample.hostname))
        if not found:
            kept.append(sample)
            continue
        if first_held is None:
            first_held, first_field = index, found[0][0]
        for _, kind, value in found:
            owner = gpus[value][1] if kind == ClaimKind.UUID else nodes[value][1]
            hostname = sample.hostname if kind == ClaimKind.UUID else ""
            sightings.setdefault((kind, value), claims.Sighting(kind, value, owner, hostname))
    held = claims.sighted(site_id, sightings.values())
    return ScopeCheck(
        samples=kept,
        held=[held[key] for key in sightings],
        first_held=first_held,
        first_field=first_field,
        gpus={uuid: entry for uuid, entry in gpus.items() if uuid not in foreign_gpus},
    )


_row_encoder = msgspec.msgpack.Encoder()
_row_decoder = msgspec.msgpack.Decoder(list[GpuSampleRow])  # type: ignore[valid-type]


def encode_rows(samples: list[Any]) -> bytes:
    """Validated samples as the queue carries a batch that names a GPU not yet registered
    (MessagePack arrays of GpuSampleRow); the others go as COPY rows (telemetry.copyrows)."""
    return _row_encoder.encode(list(map(astuple, samples)))


def decode_rows(data: bytes) -> list[Any]:
    """The writer's side of encode_rows."""
    return _row_decoder.decode(data)
