"""The edge of the GPU-sample ingest path: validate a whole batch fast, check its scope, enqueue it.

Validation uses msgspec (a compiled schema) because this is the highest-volume request in the
console; a bad batch is rejected whole with the index and field of the first fault.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

import msgspec
from django.conf import settings
from django.utils import timezone

from fleet.telemetry_fields import GPU_SAMPLE_FIELDS

UUID_PATTERN = r"^(GPU|MIG)-[0-9A-Za-z-]{6,60}$"
HOSTNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$"


def _metric_type(kind: type, minimum: float, maximum: float) -> Any:
    return Annotated[kind, msgspec.Meta(ge=minimum, le=maximum)] | None


GpuSampleIn = msgspec.defstruct(
    "GpuSampleIn",
    [
        ("gpu_uuid", Annotated[str, msgspec.Meta(pattern=UUID_PATTERN)]),
        ("hostname", Annotated[str, msgspec.Meta(pattern=HOSTNAME_PATTERN)]),
        ("ts", Annotated[datetime, msgspec.Meta(tz=True)]),
        ("gpu_index", Annotated[int, msgspec.Meta(ge=0, le=1023)] | None, None),
        ("model", Annotated[str, msgspec.Meta(max_length=64)] | None, None),
        # A MIG instance names its physical GPU and its profile (e.g. 1g.10gb).
        ("parent_uuid", Annotated[str, msgspec.Meta(pattern=UUID_PATTERN)] | None, None),
        ("mig_profile", Annotated[str, msgspec.Meta(max_length=32)] | None, None),
        *[(f.name, _metric_type(f.kind, f.minimum, f.maximum), None) for f in GPU_SAMPLE_FIELDS],
    ],
    forbid_unknown_fields=True,
    kw_only=True,
)


class GpuBatchIn(msgspec.Struct, forbid_unknown_fields=True):
    samples: list[GpuSampleIn]  # type: ignore[valid-type]


_decoder = msgspec.json.Decoder(GpuBatchIn)
_PATH = re.compile(r"at `\$(?:\.(\w+))?(?:\[(\d+)\])?(?:\.(\w+))?`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


@dataclass
class IngestError(Exception):
    """A rejected request: HTTP status and a message naming the item and field at fault."""

    status: int
    message: str
    item: int | None = None
    field: str | None = None

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.message}
        if self.item is not None:
            body["item"] = self.item
        if self.field is not None:
            body["field"] = self.field
        return body


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
        if len(idempotency_key) > 200 or not idempotency_key.isprintable():
            raise IngestError(400, "Idempotency-Key must be at most 200 printable characters.", field="Idempotency-Key")
        return f"{site_id}:k:{idempotency_key}"
    return f"{site_id}:h:{hashlib.sha256(body).hexdigest()}"


def check_site_scope(batch: GpuBatchIn, *, site_id: int) -> None:
    """Refuse (403) a batch that writes GPUs or nodes registered under another site."""
    from fleet.services import directory

    gpus = directory.gpus(s.gpu_uuid for s in batch.samples)
    nodes = directory.nodes(s.hostname for s in batch.samples)
    for index, sample in enumerate(batch.samples):
        gpu = gpus.get(sample.gpu_uuid)
        if gpu is not None and gpu[1] != site_id:
            raise IngestError(
                403,
                f"samples[{index}]: GPU {sample.gpu_uuid} belongs to another site; this token may only "
                "write its own site's GPUs.",
                item=index,
                field="gpu_uuid",
            )
        node = nodes.get(sample.hostname)
        if node is not None and node[1] != site_id:
            raise IngestError(
                403,
                f"samples[{index}]: node {sample.hostname} belongs to another site; this token may only "
                "write its own site's nodes.",
                item=index,
                field="hostname",
            )


def decode_trusted_batch(body: str | bytes) -> GpuBatchIn:
    """Decode a batch that already passed parse_gpu_batch (the worker side of the queue)."""
    return _decoder.decode(body)
