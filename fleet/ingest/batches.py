"""The edge of the GPU-sample ingest path: validate a whole batch fast, check its scope, enqueue it.

Validation uses msgspec (a compiled schema) because this is the highest-volume request in the
console; a bad batch is rejected whole with the index and field of the first fault.
"""

from __future__ import annotations

import hashlib
import operator
import re
from datetime import datetime, timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.utils import timezone
from msgspec.structs import astuple

from fleet.telemetry.fields import GPU_SAMPLE_FIELDS, MIG_INSTANCE_FIELDS, GpuSampleIn, GpuSampleRow
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
    stamps = [s.ts for s in batch.samples]
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


def _check_identities(samples: list[Any]) -> None:
    """The identity fields against their patterns, each distinct value once; the error names the
    first sample that carries a bad value, as msgspec would have."""
    for field, pattern in _IDENTITIES:
        values = {getattr(s, field) for s in samples}
        values.discard(None)
        bad = {v for v in values if not pattern.fullmatch(v)}
        if bad:
            index = next(i for i, s in enumerate(samples) if getattr(s, field) in bad)
            value = getattr(samples[index], field)
            raise IngestError(
                400,
                f"Invalid samples[{index}].{field}: {value!r} is not matching regex {pattern.pattern!r}",
                item=index,
                field=field,
            )


_parent_of = operator.attrgetter("parent_uuid")
_DEVICE_ONLY_FIELDS = tuple(f.name for f in GPU_SAMPLE_FIELDS if f.name not in MIG_INSTANCE_FIELDS)


def _check_mig_instances(samples: list[Any]) -> None:
    """A MIG instance reports only what it has of its own (utilisation, memory, activity ratios):
    power, temperatures, clocks, energy, ECC and XIDs are the physical GPU's, reported on it."""
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


def check_site_scope(batch: GpuBatchIn, *, site_id: int) -> None:
    """Refuse (403) a batch that writes GPUs or nodes registered under another site, or MIG
    instances of another site's GPU; refuse (400) a MIG instance whose physical GPU is neither
    registered nor in the batch (it would be stored as a physical GPU of its own)."""
    from fleet.inventory import directory

    samples = batch.samples
    parents = {s.parent_uuid for s in samples if s.parent_uuid} if any(map(_parent_of, samples)) else set()
    gpus = directory.gpus({s.gpu_uuid for s in samples} | parents)
    nodes = directory.nodes({s.hostname for s in samples})
    foreign_gpus = {uuid for uuid, (_, site) in gpus.items() if site != site_id}
    foreign_nodes = {hostname for hostname, (_, site) in nodes.items() if site != site_id}
    orphans = (parents - set(gpus) - {s.gpu_uuid for s in samples if not s.parent_uuid}) if parents else set()
    if not foreign_gpus and not foreign_nodes and not orphans:
        return
    for index, sample in enumerate(samples):  # name the first offending sample
        if sample.gpu_uuid in foreign_gpus or sample.parent_uuid in foreign_gpus:
            field = "gpu_uuid" if sample.gpu_uuid in foreign_gpus else "parent_uuid"
            raise IngestError(
                403,
                f"samples[{index}]: GPU {getattr(sample, field)} belongs to another site; this token may only "
                "write its own site's GPUs.",
                item=index,
                field=field,
            )
        if sample.hostname in foreign_nodes:
            raise IngestError(
                403,
                f"samples[{index}]: node {sample.hostname} belongs to another site; this token may only "
                "write its own site's nodes.",
                item=index,
                field="hostname",
            )
        if sample.parent_uuid in orphans:
            raise IngestError(
                400,
                f"samples[{index}]: the physical GPU {sample.parent_uuid} of this MIG instance is not registered; "
                "send a sample of it in the same batch.",
                item=index,
                field="parent_uuid",
            )


_row_encoder = msgspec.msgpack.Encoder()
_row_decoder = msgspec.msgpack.Decoder(list[GpuSampleRow])  # type: ignore[valid-type]


def encode_rows(samples: list[Any]) -> bytes:
    """Validated samples as the queue carries them (MessagePack arrays of GpuSampleRow)."""
    return _row_encoder.encode([astuple(s) for s in samples])


def decode_rows(data: bytes) -> list[Any]:
    """The writer's side of encode_rows."""
    return _row_decoder.decode(data)
