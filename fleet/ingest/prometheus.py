"""Prometheus text exposition in: dcgm-exporter, vLLM, Triton, TGI and node_exporter scrapes, as
pushed or scraped.

Parsing uses prometheus_client's parser. DCGM fields become GPU samples (the same schema and
writer as the JSON door); serving metrics (gauges, counters, histogram buckets) are stored per
endpoint as raw series for the serving SLO work. A malformed exposition is refused whole with
the line at fault; nothing is written. A serving series whose values no read could use (NaN, ±Inf,
beyond ``MAX_MAGNITUDE``, a negative count) is ignored whole and counted. node_exporter's port,
file system, NFS mountstats and disk series become node series (fleet.fabric, fleet.storage);
the node is named as for dcgm-exporter: a ``hostname`` label or ``?hostname=`` (a target's
hostname). Kueue's, kube-state-metrics' and a Slurm exporter's series become scheduler queue
series (fleet.scheduler), the queue named by its label.

Which names are read, and as what, is the exporter mapping table's (fleet.exporters: each room's
mappings.py); this module holds the readers of each shape and the bounds every push is held to.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple
from uuid import uuid4

import msgspec
from django.conf import settings
from prometheus_client.openmetrics.parser import text_fd_to_metric_families as text_fd_to_openmetrics_families
from prometheus_client.parser import text_fd_to_metric_families

from fleet import exporters
from fleet.choices import ServingFramework
from fleet.fabric.store import port_part
from fleet.ingest import plans
from fleet.ingest.batches import (
    GpuBatchIn,
    GpuSampleIn,
    ScopeCheck,
    check_idempotency_key,
    check_site_scope,
    invalid_identity,
)
from fleet.scheduler.mappings import SCHEDULER_IDENTITY_LABELS, SCHEDULER_LABEL_LIMITS, QueueSeries
from fleet.scheduler.store import QUEUE_COUNTERS, QueuePoint, store_queue_points
from fleet.serving import metrics as sm
from fleet.serving.mappings import ServingSeries
from fleet.serving.store import ServingPoint, store_serving_points
from fleet.storage.store import storage_parts
from fleet.telemetry.fields import COUNTER_FIELDS, FIELDS_BY_NAME, MIG_INSTANCE_FIELDS
from fleet.telemetry.series import NodePoint, NodeSeries, Part, claim_foreign_nodes, store_parts
from fleet.telemetry.store import PendingBatch, store_gpu_batches
from fleet.validation import HOSTNAME_PATTERN, IngestError

# Fields DCGM reports as 64-bit integers (counters); the rest are 32-bit integers or doubles.
INT64_FIELDS = COUNTER_FIELDS
# DCGM's "blank" sentinels (dcgm_structs.h): values at or above these mean "no value", never data.
INT32_BLANK = 0x7FFFFFF0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0

# A push's lines are held while it is checked (about 1.2 KB of the web process a stored sample,
# with its queued copy): 40,000 keep a push under 64 MB (bench/ingest_bounds.py). The OpenMetrics
# parser also holds each family whole until it ends (it checks a family whole): half as many.
MAX_LINES = 40_000
OPENMETRICS_MAX_LINES = MAX_LINES // 2
KINDS = ("auto", "dcgm", "vllm", "triton", "tgi", "node")

# mountstats' per-operation series carry an ``operation`` label: only READ's are stored (the read
# side of a datasets mount); the other operations' are ignored and counted.
NODE_OPERATION = {
    "node_mountstats_nfs_operations_requests_total": "READ",
    "node_mountstats_nfs_operations_response_time_seconds_total": "READ",
}
# The labels that name what a node series measures, per collector; each must be there.
NODE_LABELS = {
    "infiniband": ("device", "port"),
    "netdev": ("device",),
    "disk": ("device",),
    "filesystem": ("device", "mountpoint", "fstype"),
    "mountstats": ("export",),  # the mount's device as the filesystem collector names it
}
# Where a label becomes a column (an interface's name is ``device/port``: 120 + 1 + 7 <= 128).
NODE_LABEL_LIMITS = {
    "infiniband": {"device": 120, "port": 7, "hostname": 253, "Hostname": 253},
    "netdev": {"device": 128, "hostname": 253, "Hostname": 253},
    "disk": {"device": 128, "hostname": 253, "Hostname": 253},
    "filesystem": {"device": 255, "mountpoint": 512, "fstype": 32, "hostname": 253, "Hostname": 253},
    "mountstats": {"export": 255, "hostname": 253, "Hostname": 253},
}
NODE_IGNORED_DEVICES = frozenset({"lo"})  # the loopback interface: no fabric

# Label values are bounded where they become a column, and everywhere else by LABEL_MAX: a value
# past its column would otherwise be cut, and two series that differ only past the cut collide.
LABEL_MAX = 1024
LABEL_LIMITS = {"UUID": 64, "uuid": 64, "hostname": 253, "Hostname": 253, "modelName": 64, "GPU_I_PROFILE": 32}
SERVING_LABEL_LIMITS = {"model_name": 200, "model": 200, "version": 64}
METRIC_NAME_MAX = 200
LABELS_MAX = 64
SERIES_BYTES_MAX = 2000  # labels as stored: under PostgreSQL's btree entry limit with the key's other columns
# Labels whose values become names in columns (a node, an endpoint, a model): printable only.
IDENTITY_LABELS = frozenset(
    {"hostname", "Hostname", "UUID", "uuid", "modelName", "GPU_I_PROFILE", "model", "model_name"}
)
ENDPOINT_NAME_MAX = 200
MIG_INSTANCE_MAX = 32767
HOSTNAME_RE = re.compile(HOSTNAME_PATTERN.removeprefix("^").removesuffix("$"))
IGNORED_NAMES_SHOWN = 20
_UNSEEN = object()  # a name not yet looked up in the mapping table


@dataclass
class Exposition:
    gpu_samples: list[Any] = field(default_factory=list)
    serving: list[ServingPoint] = field(default_factory=list)
    node: list[NodePoint] = field(default_factory=list)  # node_exporter ports, mounts, disks
    scheduler: list[QueuePoint] = field(default_factory=list)  # Kueue, kube-state-metrics, Slurm
    ignored: int = 0  # samples not stored: metrics this console does not use, or series it cannot read
    ignored_metrics: Counter[str] = field(default_factory=Counter)  # how many of each were ignored
    timestamped: bool = True  # every stored sample carried its own timestamp

    @property
    def count(self) -> int:
        return len(self.gpu_samples) + len(self.serving) + len(self.node) + len(self.scheduler)

    def ignore(self, name: str) -> None:
        self.ignored += 1
        self.ignored_metrics[name] += 1


class _Lines:
    """Feeds the parser line by line, remembering the line number and the declared counters. The
    text is walked, never split: a push's lines are not all held at once.

    With ``alone`` (the 0.0.4 text format), the parser is given no comment lines: each is checked
    by the parser on its own, and the parser sees a blank line. Without a ``# TYPE`` or ``# HELP``
    before them, the parser hands every sample over as it reads it, as a family of its own,
    instead of holding a whole family's samples until the family ends (a push's one family can
    be all of it); the samples read the same (``exposed_name`` gives a counter's name as
    exposed either way)."""

    def __init__(self, text: str, *, alone: bool = False) -> None:
        self.text = text
        self.alone = alone
        self.number = 0  # the line the parser is reading (exact when it raises)
        self.declared: set[str] = set()
        # The parser hands samples over a family at a time, after reading ahead; each sample line
        # holds one sample, in order, so the n-th sample handed over came from sample_lines[n].
        self.sample_lines = array("l")

    def __iter__(self) -> Iterator[str]:
        # Lines end at \n only, as Prometheus reads them: str.splitlines() would also cut at
        # \u2028, \x1c and friends, which are legal inside a label value. A last \n ends the
        # last line rather than starting an empty one.
        text, start, length = self.text, 0, len(self.text)
        while start < length:
            end = text.find("\n", start)
            if end == -1:
                end = length
            line = text[start:end]
            start = end + 1
            self.number += 1
            stripped = line.strip()
            if stripped.startswith("# TYPE "):
                parts = stripped.split()
                if len(parts) >= 3:
                    self.declared.add(parts[2])
            elif stripped and not stripped.startswith("#"):
                self.sample_lines.append(self.number)
            if self.alone and stripped.startswith("#"):
                _check_comment(line)
                line = ""
            yield line

    def line(self, number: int) -> str:
        """The text of line ``number`` (1-based; "" past the last)."""
        start = 0
        for _ in range(number - 1):
            start = self.text.find("\n", start) + 1
            if start == 0:
                return ""
        end = self.text.find("\n", start)
        return self.text[start : end if end != -1 else len(self.text)]

    def all(self) -> list[str]:
        """Every line, as the walk reads them."""
        lines = self.text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return lines

    def exposed_name(self, sample_name: str, family_type: str) -> str:
        """prometheus_client appends _total to counter samples; give back the name as exposed."""
        if family_type == "counter" and sample_name not in self.declared:
            base = sample_name.removesuffix("_total")
            if base in self.declared:
                return base
        return sample_name


# Comment lines the parser found sound: an exporter sends the same HELP and TYPE lines every
# scrape. Bounded; cleared when full.
_sound_comments: set[str] = set()
_SOUND_COMMENTS_MAX = 10_000


def _check_comment(line: str) -> None:
    """The parser's checks of one comment line (a TYPE without a type, a bad metric name), as it
    makes them reading it among samples; ValueError where it would raise one."""
    if line in _sound_comments:
        return
    for _ in text_fd_to_metric_families(iter((line,))):
        pass
    if len(_sound_comments) >= _SOUND_COMMENTS_MAX:
        _sound_comments.clear()
    _sound_comments.add(line)


def _blank(name: str, value: float) -> bool:
    """Is this DCGM's "no value" sentinel? Outside the 64-bit counters no real reading comes near
    2**31 (temperatures, clocks, watts, MiB), so the 32-bit threshold also catches the 64-bit and
    floating-point sentinels (DCGM_FP64_BLANK is 2**47)."""
    return value >= (INT64_BLANK if name in INT64_FIELDS else INT32_BLANK)


def _series(labels: dict[str, str], skip: str) -> str:
    """Canonical labels as Prometheus writes them (sorted, values escaped), so two different label
    sets can never read as the same series."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if k != skip)


def _series_digest(name: str, labels: dict[str, str]) -> bytes:
    """A series (name and label set) as 16 bytes, to tell a repeat by: a push's lines are each
    kept this small while it is read, not as their labels. No name or label holds a NUL (the
    door refuses one), so NUL-separated they read one way only."""
    parts = [name]
    for label, value in sorted(labels.items()):
        parts += (label, value)
    return hashlib.blake2b("\x00".join(parts).encode(), digest_size=16).digest()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _bad(line: int, message: str, *, field: str | None = None, status: int = 400) -> IngestError:
    return IngestError(status, f"line {line}: {message}", item=line, field=field)


@dataclass
class _Window:
    """The times a stored sample may carry: the JSON door's window around the receive time."""

    received: datetime
    oldest: float
    newest: float
    last: tuple[float, datetime] | None = None  # the last timestamp read: a scrape's lines share one

    @classmethod
    def around(cls, received: datetime) -> _Window:
        now = received.timestamp()
        return cls(received, now - settings.INGEST_MAX_AGE_SECONDS, now + settings.INGEST_MAX_FUTURE_SECONDS)

    def time_of(self, timestamp: float | None, line: int) -> datetime:
        if timestamp is None:
            return self.received
        if self.last is not None and self.last[0] == timestamp:
            return self.last[1]
        # Checked as a number first: 1e20 ms or NaN would break datetime before any range test.
        if not math.isfinite(timestamp) or timestamp > self.newest:
            raise _bad(
                line,
                f"the timestamp {_shown(timestamp)} is more than {settings.INGEST_MAX_FUTURE_SECONDS} s ahead of "
                "the console's clock (timestamps are milliseconds since 1970; check the exporter's clock).",
                field="timestamp",
            )
        if timestamp < self.oldest:
            raise _bad(
                line,
                f"the timestamp {_shown(timestamp)} is older than the {settings.INGEST_MAX_AGE_SECONDS} s accepted.",
                field="timestamp",
            )
        moment = datetime.fromtimestamp(timestamp, UTC)
        self.last = (timestamp, moment)
        return moment


def _shown(timestamp: float) -> str:
    try:
        return f"{datetime.fromtimestamp(timestamp, UTC).isoformat()} ({timestamp * 1000:.0f} ms)"
    except (ValueError, OverflowError, OSError):
        return f"{timestamp * 1000:g} ms"


def _check_labels(line: int, name: str, labels: dict[str, str], limits: dict[str, int]) -> None:
    """Each label value within its column, and the whole series within what one index entry can
    hold (PostgreSQL refuses a btree entry past about 2.7 kB: the serving table's key)."""
    if len(name) > METRIC_NAME_MAX:
        raise _bad(line, f"the metric name is {len(name)} characters; at most {METRIC_NAME_MAX}.", field="__name__")
    if len(labels) > LABELS_MAX:
        raise _bad(line, f"{len(labels)} labels; at most {LABELS_MAX} per series.", field="labels")
    size = len(name)
    for label, value in labels.items():
        limit = limits.get(label, LABEL_MAX)
        if len(value) > limit:
            raise _bad(line, f"label {label} is {len(value)} characters long; at most {limit} are kept.", field=label)
        if label in IDENTITY_LABELS and not _IDENTITY_TEXT.fullmatch(value):
            raise _bad(line, f"label {label} must be printable text.", field=label)
        size += len(label.encode()) + len(value.encode()) + 4
    if size > SERIES_BYTES_MAX:
        raise _bad(
            line, f"the series' labels come to {size} bytes; at most {SERIES_BYTES_MAX} per series.", field="labels"
        )


def parse_exposition(
    text: str,
    *,
    hostname: str | None = None,
    endpoint: str | None = None,
    kind: str = "auto",
    now: str | datetime | None = None,
    openmetrics: bool = False,
) -> Exposition:
    """Parse and validate a whole exposition; raise IngestError naming the line at fault.

    What passes here can be stored: every bound the database has (column lengths, index entry
    size, NUL, time partitions within retention) is checked now, so a push answered 202 never
    fails later on its own data. ``openmetrics`` reads the OpenMetrics text format (timestamps in
    seconds, exemplars, ``# EOF``) instead of the 0.0.4 text format.
    """
    received = datetime.fromisoformat(now) if isinstance(now, str) else (now or datetime.now(UTC))
    if (len(text) if text.isascii() else len(text.encode())) > settings.INGEST_MAX_BYTES:
        raise IngestError(413, f"Body is larger than the limit of {settings.INGEST_MAX_BYTES} bytes.")
    _check_options(hostname=hostname, endpoint=endpoint, kind=kind)
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise _bad(line, "a NUL character; the exposition format is UTF-8 text without NULs.")
    # Lines end at \n only (as _Lines splits them); counted without splitting, which only the
    # full parse needs.
    line_count = text.count("\n") + (not text.endswith("\n"))
    if line_count > MAX_LINES:
        raise IngestError(413, f"The exposition has {line_count} lines; at most {MAX_LINES}.")
    if openmetrics and line_count > OPENMETRICS_MAX_LINES:
        raise IngestError(
            413, f"The exposition has {line_count} lines; at most {OPENMETRICS_MAX_LINES} in the OpenMetrics format."
        )
    window = _Window.around(received)
    plannable = not openmetrics and line_count <= plans.MAX_PUSH_LINES
    shape = plans.skeleton(text, f"{hostname}\x00{endpoint}\x00{kind}") if plannable else None
    if shape is not None:
        planned = Exposition()
        if plans.read(shape, planned, time_of=window.time_of, magnitude=sm.MAX_MAGNITUDE):
            return planned
    lines = _Lines(text, alone=not openmetrics)
    recorder = plans.Recorder(plannable=shape is not None)
    gpus: dict[str, dict[str, Any]] = {}
    origin: dict[tuple[str, str], int] = {}  # (uuid, field) -> line, to name the line of a bad value
    seen: dict[bytes, int] = {}  # series (its digest: _series_digest) -> its line
    out = Exposition()
    serving: list[tuple[str | None, str, ServingPoint]] = []  # (series group, name, point)
    groups: dict[str, str] = {}
    unreadable: set[str] = set()  # series groups with a value no read can use
    queued: list[tuple[str, QueueSeries, QueuePoint]] = []  # scheduler series, before summing
    mapped: dict[str, exporters.Hit | None] = {}  # exposed name -> its entry in the mapping table
    handed = 0
    for family in _families(lines, openmetrics=openmetrics):
        samples = family.samples
        for position, sample in enumerate(samples):
            samples[position] = None  # the parser's copy goes as the door reads it
            line = lines.sample_lines[handed] if handed < len(lines.sample_lines) else lines.number
            handed += 1
            name = sample.name if openmetrics else lines.exposed_name(sample.name, family.type)
            if (first := seen.setdefault(_series_digest(name, sample.labels), line)) != line:
                raise _bad(line, f"the series of line {first} again ({name}); each series once per exposition.")
            timestamp = None if sample.timestamp is None else float(sample.timestamp)
            if openmetrics and name.endswith("_created"):
                out.ignore(name)  # a counter's creation time, not a reading
                continue
            # The exporter mapping table (fleet.exporters), looked up once per name in a push.
            hit = mapped.get(name, _UNSEEN)
            if hit is _UNSEEN:
                hit = mapped[name] = exporters.lookup(name)
            mapping, spec = hit or (None, None)
            reads = mapping.reads if mapping is not None and kind in mapping.kinds else None
            if reads == exporters.GPU_FIELD:
                recorder.other()
                _check_labels(line, name, sample.labels, LABEL_LIMITS)
                ts = window.time_of(timestamp, line)
                out.timestamped &= timestamp is not None
                _add_gpu_value(gpus, origin, line, spec, sample.labels, sample.value, ts, hostname)
                continue
            if reads == exporters.SERVING and not (spec.model_required and spec.model_label not in sample.labels):
                recorder.other()
                _check_labels(line, name, sample.labels, SERVING_LABEL_LIMITS)
                _check_bound(line, name, sample.labels)
                ts = window.time_of(timestamp, line)
                out.timestamped &= timestamp is not None
                point = _serving_point(name, spec, sample.labels, sample.value, ts, endpoint, line)
                group = _series_group(point, sample.labels)
                if group is not None:
                    group = groups.setdefault(group, group)  # one string a histogram, not one a part
                if not _readable(name, sample.labels, sample.value):
                    group = group or ""  # "": a series ignored alone (a group always holds a NUL)
                    unreadable.add(group)
                serving.append((group, name, point))
                continue
            if reads == exporters.NODE:
                fields = _node_fields(line, name, spec, sample.labels, hostname)
                recorder.node(line, name, fields)
                ts = window.time_of(timestamp, line)
                point = None if fields is None else _node_point(fields, sample.value, ts)
                if point is None:
                    out.ignore(name)
                else:
                    out.timestamped &= timestamp is not None
                    out.node.append(point)
                continue
            if reads == exporters.QUEUE:
                recorder.other()
                queue_point = _queue_point(line, name, spec, sample.labels, sample.value, window, timestamp)
                if queue_point is None:
                    out.ignore(name)
                else:
                    out.timestamped &= timestamp is not None
                    queued.append((name, spec, queue_point))
                continue
            # Not mapped, mapped for another ?kind=, mapped from the push's text (exporters.PUSH), or
            # not the server's own (a Triton series without its model: ServingSeries.model_required).
            out.ignore(name)
            recorder.ignored(line, name)
    out.scheduler = _fold_queue_points(queued, out)
    # A series with a value no read can use (NaN, ±Inf, past MAX_MAGNITUDE, a negative count) is
    # ignored whole: for a histogram, every bucket, its sum and its count, since a histogram
    # missing one bucket would move its percentiles.
    for group, name, point in serving:
        if group in unreadable:
            out.ignore(name)
        else:
            out.serving.append(point)
    out.gpu_samples = _validated_gpu_samples(gpus, origin)
    out.timestamped &= out.count > 0
    if shape is not None:
        plans.keep(shape, recorder, lines.all() if recorder.plannable else [], lines.sample_lines)
    return out


def _families(lines: _Lines, *, openmetrics: bool) -> Iterator[Any]:
    """The parser's metric families; a parse error becomes a 400 naming the line. Only the
    parser's own work is wrapped: a bug in our handling of a sample stays a bug, not a 400."""
    parse = text_fd_to_openmetrics_families if openmetrics else text_fd_to_metric_families
    families = iter(parse(iter(lines)))
    while True:
        try:
            family = next(families)
        except StopIteration:
            return
        except (ValueError, IndexError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            number = lines.number or 1
            text = lines.line(number)[:200]
            raise _bad(number, f"cannot parse ({str(exc) or exc.__class__.__name__}): {text!r}") from None
        yield family


_IDENTITY_TEXT = re.compile(r"[^\x00-\x1f\x7f]+")


def _check_options(*, hostname: str | None, endpoint: str | None, kind: str) -> None:
    """The query's options: ?hostname= names a host, ?endpoint= a printable name (it becomes
    the endpoint's name, a column), ?kind= one of KINDS."""
    if kind not in KINDS:
        raise IngestError(400, f"kind must be one of {', '.join(KINDS)}.", field="kind")
    if hostname is not None and not HOSTNAME_RE.fullmatch(hostname):
        raise IngestError(400, "hostname is not a valid hostname.", field="hostname")
    if endpoint is not None and (len(endpoint) > ENDPOINT_NAME_MAX or not _IDENTITY_TEXT.fullmatch(endpoint)):
        raise IngestError(400, f"endpoint must be 1 to {ENDPOINT_NAME_MAX} printable characters.", field="endpoint")


def _gpu_index(line: int, labels: dict[str, str]) -> int | None:
    raw = labels.get("gpu", "")
    if not raw:
        return None
    if not raw.isascii() or not raw.isdigit() or int(raw) > 1023:
        raise _bad(line, f"label gpu is {raw[:40]!r}; a GPU index from 0 to 1023.", field="gpu")
    return int(raw)


def _add_gpu_value(
    gpus: dict[str, dict[str, Any]],
    origin: dict[tuple[str, str], int],
    line: int,
    name: str,
    labels: dict[str, str],
    value: float,
    ts: datetime,
    hostname: str | None,
) -> None:
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        raise _bad(line, "a DCGM sample without a UUID label.", field="UUID")
    host = labels.get("hostname") or labels.get("Hostname") or hostname
    if not host:
        raise _bad(line, "no hostname or Hostname label; pass ?hostname= for this exporter.", field="hostname")
    index = _gpu_index(line, labels)
    model = labels.get("modelName") or None
    physical = _gpu_entry(gpus, uuid, host=host, index=index, model=model, ts=ts, line=line)
    origin.setdefault((uuid, ""), line)  # the first line naming this GPU, for errors about it
    gpu = physical
    mig_id = labels.get("GPU_I_ID", "")
    if mig_id:
        # A MIG instance: its own row under the physical GPU, for the fields an instance has of its
        # own. Power, temperatures, clocks, energy, ECC and XIDs belong to the physical GPU even
        # when an exporter repeats them on each instance.
        if not mig_id.isascii() or not mig_id.isdigit() or int(mig_id) > MIG_INSTANCE_MAX:
            raise _bad(line, f"label GPU_I_ID is {mig_id[:40]!r}; a MIG instance id.", field="GPU_I_ID")
        if name in MIG_INSTANCE_FIELDS:
            instance_uuid = f"MIG-{uuid.removeprefix('GPU-')}-gi{int(mig_id)}"
            gpu = _gpu_entry(gpus, instance_uuid, host=host, index=index, model=model, ts=ts, line=line)
            gpu["parent_uuid"] = uuid
            gpu["mig_profile"] = labels.get("GPU_I_PROFILE", "")
            gpu["mig_instance_id"] = int(mig_id)
            uuid = instance_uuid
            origin.setdefault((uuid, ""), line)
        elif name in physical:
            return  # the physical GPU's own line (or an earlier instance's copy) already gave it
    origin[(uuid, name)] = line
    if math.isnan(value) or math.isinf(value) or _blank(name, value):
        gpu[name] = None  # no value: not supported, not measured, or not a number at all
    else:
        gpu[name] = value if FIELDS_BY_NAME[name].kind is float else int(value)


def _gpu_entry(
    gpus: dict[str, dict[str, Any]],
    uuid: str,
    *,
    host: str,
    index: int | None,
    model: str | None,
    ts: datetime,
    line: int,
) -> dict[str, Any]:
    gpu = gpus.get(uuid)
    if gpu is None:
        if len(gpus) == settings.INGEST_MAX_ITEMS:
            # Each GPU is a sample, held whole until the push is checked: as many as a JSON batch.
            raise _bad(
                line,
                f"a push with samples of more than {settings.INGEST_MAX_ITEMS:,} GPUs (and MIG instances); "
                "at most GOODPUT_INGEST_MAX_ITEMS, as in a JSON batch.",
                field="UUID",
                status=413,
            )
        gpu = gpus[uuid] = {"gpu_uuid": uuid, "hostname": host, "ts": ts}
        if index is not None:
            gpu["gpu_index"] = index
        if model:
            gpu["model"] = model
    gpu["ts"] = max(gpu["ts"], ts)
    return gpu


MIG_SLICES = re.compile(r"(\d+)g\.")  # 3g.40gb, 1c.3g.40gb: the GPU instance's compute slices
MIG_SLICES_PER_GPU = 7  # A100, H100, H200, B200


def _mig_parent_utilisation(gpus: dict[str, dict[str, Any]]) -> None:
    """A GPU in MIG mode has no utilisation of its own in DCGM: give it its instances' graphics
    activity weighted by their share of the GPU's compute slices, so a busy MIG GPU is busy in
    every fleet and site average (where its instances never count)."""
    busy: dict[str, float] = {}
    for values in gpus.values():
        parent, active = values.get("parent_uuid"), values.get("gr_engine_active")
        slices = MIG_SLICES.search(values.get("mig_profile") or "")
        if parent and active is not None and slices:
            busy[parent] = busy.get(parent, 0.0) + active * int(slices.group(1)) / MIG_SLICES_PER_GPU
    for parent, share in busy.items():
        if parent in gpus and gpus[parent].get("gpu_util") is None:
            gpus[parent]["gpu_util"] = round(min(100.0, 100 * share), 2)


def _validated_gpu_samples(gpus: dict[str, dict[str, Any]], origin: dict[tuple[str, str], int]) -> list[Any]:
    _mig_parent_utilisation(gpus)
    samples = []
    for uuid, values in gpus.items():
        if values.get("parent_uuid") and values.get("gpu_util") is None and values.get("gr_engine_active") is not None:
            # On MIG, DCGM has no utilisation per instance; its graphics-engine activity is the
            # instance's utilisation (what nvidia-smi and NVIDIA's MIG dashboards show).
            values["gpu_util"] = round(100 * values["gr_engine_active"], 2)
        try:
            sample = msgspec.convert(values, GpuSampleIn)
        except msgspec.ValidationError as exc:
            text = str(exc)
            name = text.rsplit("$.", 1)[-1].rstrip("`") if "$." in text else None
            line = origin.get((uuid, name or "")) or min(ln for (u, _), ln in origin.items() if u == uuid)
            raise _bad(line, f"{name or 'value'} of {uuid}: {text}", field=name) from None
        if field := invalid_identity(sample):
            line = min(ln for (u, _), ln in origin.items() if u == uuid)
            raise _bad(line, f"malformed {field} {getattr(sample, field)!r} (a label).", field=field)
        samples.append(sample)
    return samples


def _check_bound(line: int, name: str, labels: dict[str, str]) -> None:
    """A histogram bucket's ``le`` must be a bound a read can use: a finite number (at most
    MAX_MAGNITUDE) or +Inf. Anything else cannot be read, so the push is refused naming the line."""
    if name.endswith("_bucket") and "le" in labels and sm.bucket_bound(labels["le"]) is None:
        raise _bad(
            line,
            f"label le is {labels['le'][:40]!r}; a bucket's upper bound is a number "
            f"(at most {sm.MAX_MAGNITUDE:g} either side of 0) or +Inf.",
            field="le",
        )


def _readable(name: str, labels: dict[str, str], value: float) -> bool:
    """Can the reads use this value: finite, within MAX_MAGNITUDE (so no sum of them overflows),
    and never below zero for a counter or a histogram's bucket or count (which only go up)."""
    if not sm.readable(value):
        return False
    if value < 0:
        quantity = sm.quantity_of(name, labels)
        if quantity is not None and (quantity.kind == "counter" or sm.histogram_part(name) in ("bucket", "count")):
            return False
    return True


def _series_group(point: ServingPoint, labels: dict[str, str]) -> str | None:
    """What is ignored together: all the parts of one histogram (its base name and labels but
    ``le``) under one endpoint, NUL-separated (no label holds a NUL); None for a series that is a
    group of its own."""
    part = sm.histogram_part(point.metric)
    if part is None and "le" not in labels:
        return None
    base = point.metric if part is None else point.metric.removesuffix(f"_{part}")
    parts = [point.endpoint, base]
    for label, value in sorted(labels.items()):
        if label != "le":
            parts += (label, value)
    return "\x00".join(parts)


def _serving_point(
    name: str,
    spec: ServingSeries,
    labels: dict[str, str],
    value: float,
    ts: datetime,
    endpoint: str | None,
    line: int,
) -> ServingPoint:
    """One serving series value (parse_exposition drops the series whose values cannot be read)."""
    framework, model_label = spec.framework, spec.model_label
    model = labels.get(model_label, "") if model_label else ""
    name_for_endpoint = endpoint or model
    # The model label is left out of the series only where it names the endpoint: with an
    # explicit endpoint, two models' series must stay two series.
    skip = "" if endpoint else model_label
    if not name_for_endpoint:
        raise _bad(line, f"cannot tell which endpoint {name} belongs to; pass ?endpoint=NAME.", field="endpoint")
    # A push names a few endpoints and metrics many times: each name is held once, not once a point.
    return ServingPoint(
        endpoint=sys.intern(name_for_endpoint),
        framework=framework,
        model_name=sys.intern(model),
        ts=ts,
        metric=sys.intern(name),
        series=_series(labels, skip),
        value=value,
        version=labels.get("version", "") if framework == ServingFramework.TRITON else "",
    )


def _node_fields(
    line: int, name: str, series: NodeSeries, labels: dict[str, str], hostname: str | None
) -> tuple[Any, ...] | None:
    """What a node_exporter series names (plans.Entry's fields), or None when it is not stored
    (the loopback interface; an NFS operation other than the one kept). A series without the
    labels its collector always exports, or without a node, is refused naming the line. A
    mountstats value names its mount by ``export`` (kept as the point's ``device``: the
    filesystem collector's ``device`` of that mount)."""
    source, quantity, counter = series
    _check_labels(line, name, labels, NODE_LABEL_LIMITS[source])
    for label in (*NODE_LABELS[source], "hostname", "Hostname"):
        if label in labels and not _IDENTITY_TEXT.fullmatch(labels[label]):
            raise _bad(line, f"label {label} must be printable text.", field=label)
    operation = NODE_OPERATION.get(name)
    for label in (*NODE_LABELS[source], *(("operation",) if operation else ())):
        if not labels.get(label):
            raise _bad(line, f"{name} without a {label} label (node_exporter always exports one).", field=label)
    host = labels.get("hostname") or labels.get("Hostname") or hostname
    if not host:
        raise _bad(line, "no hostname or Hostname label; pass ?hostname= for this exporter.", field="hostname")
    if not HOSTNAME_RE.fullmatch(host):
        raise _bad(line, f"malformed hostname {host[:80]!r} (a label).", field="hostname")
    if source in ("infiniband", "netdev") and labels["device"] in NODE_IGNORED_DEVICES:
        return None
    if operation is not None and labels["operation"] != operation:
        return None  # another NFS operation (WRITE, GETATTR, ...): not stored
    device = labels["export"] if source == "mountstats" else labels["device"]
    # Held once however many points name them (a host's ports, a mount's series).
    return (
        sys.intern(host),
        source,
        quantity,
        sys.intern(device),
        sys.intern(labels.get("port", "")),
        sys.intern(labels.get("mountpoint", "")),
        sys.intern(labels.get("fstype", "")),
        counter,
    )


def _node_point(fields: tuple[Any, ...], value: float, ts: datetime) -> NodePoint | None:
    """One node_exporter value, or None for a value no read can use (NaN, ±Inf, past
    MAX_MAGNITUDE, a negative counter)."""
    if not sm.readable(value) or (fields[7] and value < 0):
        return None
    return NodePoint(fields[0], fields[1], fields[2], ts, value, fields[3], fields[4], fields[5], fields[6])


# Scheduler series: the series text of a queue's kept labels, bounded as the column is.
QUEUE_SERIES_MAX = 1024


def _queue_point(
    line: int,
    name: str,
    spec: QueueSeries,
    labels: dict[str, str],
    value: float,
    window: _Window,
    timestamp: float | None,
) -> QueuePoint | None:
    """One scheduler value, or None when it is not stored: a Kueue follower replica's copy, a
    resource other than GPUs where only GPUs are kept, a value no read can use (NaN, -Inf, past
    MAX_MAGNITUDE, a negative counter; +Inf only as an unset limit). A series without the label
    naming its queue, or without a label its exporter always exports, is refused naming the line."""
    _check_labels(line, name, labels, SCHEDULER_LABEL_LIMITS)
    for label in SCHEDULER_IDENTITY_LABELS & labels.keys():
        if labels[label] and not _IDENTITY_TEXT.fullmatch(labels[label]):  # blank: a pod on no node yet
            raise _bad(line, f"label {label} must be printable text.", field=label)
    for label in (*((spec.queue_label,) if spec.queue_label else ()), *spec.required):
        if not labels.get(label):
            raise _bad(line, f"{name} without a {label} label (its exporter always exports one).", field=label)
    _check_bound(line, name, labels)
    ts = window.time_of(timestamp, line)
    if labels.get("replica_role") == "follower" or (spec.only is not None and not spec.only(labels)):
        return None
    if not spec.histogram and not _usable(spec, value):
        return None  # a histogram's parts are judged together (_fold_queue_points)
    kept = {k: labels[k] for k in spec.keep if k in labels}
    kept.update(spec.fixed)
    series = _series(kept, "")
    if len(series.encode()) > QUEUE_SERIES_MAX:
        raise _bad(line, f"the series' labels come to more than {QUEUE_SERIES_MAX} bytes.", field="labels")
    return QueuePoint(
        scheduler=spec.scheduler,
        queue=spec.queue_of(labels),
        quantity=spec.quantity,
        series=series,
        ts=ts,
        value=value,
        cohort=labels.get("cohort"),
        kind=spec.kind,
    )


def _usable(spec: QueueSeries, value: float) -> bool:
    """Can the reads use this value: readable (finite, within MAX_MAGNITUDE), never below zero for
    a counter, and +Inf only as an unset limit."""
    if spec.unlimited and value == math.inf:
        return True
    return sm.readable(value) and not (spec.quantity in QUEUE_COUNTERS and value < 0)


def _histogram_of(point: QueuePoint) -> tuple[str, ...]:
    """The histogram a part belongs to: its queue and its labels but ``le``."""
    rest = sorted(f"{k}={v}" for k, v in sm.parse_series(point.series).items() if k != "le")
    return (point.scheduler, point.kind, point.queue, *rest)


def _fold_queue_points(queued: list[tuple[str, QueueSeries, QueuePoint]], out: Exposition) -> list[QueuePoint]:
    """One value per queue series per exposition. A histogram with a part no read can use is
    ignored whole (a histogram missing one bucket would move its percentiles). A summed gauge adds
    up its pods (pods per phase in a namespace, GPUs requested per node); any other series seen
    again under the labels kept (two exporters' copies, told apart only by instance or uid) keeps
    its first value and the others are ignored and counted."""
    unreadable = {_histogram_of(p) for _, spec, p in queued if spec.histogram and not _usable(spec, p.value)}
    folded: dict[tuple[str, str, str, str, str], QueuePoint] = {}
    for name, spec, point in queued:
        if spec.histogram and _histogram_of(point) in unreadable:
            out.ignore(name)
            continue
        # The kind too: a Slurm account may share a partition's name.
        key = (point.scheduler, point.kind, point.queue, point.quantity, point.series)
        first = folded.get(key)
        if first is None:
            folded[key] = point
        elif spec.summed:
            folded[key] = replace(first, value=first.value + point.value, ts=max(first.ts, point.ts))
        else:
            out.ignore(name)
    return list(folded.values())


# --- handing over to the writers ---------------------------------------------------------------
# The door queues the exposition it parsed and checked, not its body, so the worker stores it
# without parsing it again (prometheus_client's parser is most of a push's cost). Marked by a NUL,
# which no text exposition holds (parse_exposition refuses one): a body queued as text (a task
# from before this mark, a dead letter kept from then) is still parsed.
PARSED_MARK = b"\x00goodput-exposition/1\x00"


class _Parsed(msgspec.Struct, array_like=True):
    gpu_samples: list[GpuSampleIn]  # type: ignore[valid-type]
    serving: list[ServingPoint]
    node: list[NodePoint]
    scheduler: list[QueuePoint]


_PACK = msgspec.msgpack.Encoder()
_UNPACK = msgspec.msgpack.Decoder(_Parsed)


def packed(exposition: Exposition) -> bytes:
    """The exposition's values as the queue carries them (MessagePack, after ``PARSED_MARK``)."""
    parsed = _Parsed(exposition.gpu_samples, exposition.serving, exposition.node, exposition.scheduler)
    return PARSED_MARK + _PACK.encode(parsed)


def unpacked(payload: bytes | str, options: dict[str, Any]) -> Exposition:
    """The exposition a queued payload holds: the door's parse (``packed``), or a text body parsed
    with the door's options (the same receive time, so the same samples)."""
    if isinstance(payload, bytes) and payload.startswith(PARSED_MARK):
        parsed = _UNPACK.decode(memoryview(payload)[len(PARSED_MARK) :])
        return Exposition(
            gpu_samples=parsed.gpu_samples, serving=parsed.serving, node=parsed.node, scheduler=parsed.scheduler
        )
    return parse_exposition(payload.decode() if isinstance(payload, bytes) else payload, **options)


# --- storing --------------------------------------------------------------------------------


def exposition_key(
    *, site_id: int, body: str | bytes, idempotency_key: str | None, options: dict[str, Any], timestamped: bool
) -> str:
    """The push's idempotency key.

    An explicit Idempotency-Key dedupes retries. Without one, only a body whose every sample
    carries its own timestamp is the same observation when sent twice; a plain exposition sent
    twice (a cron job, an idle GPU reporting the same values) is two observations, at two
    receive times, and both are stored.
    """
    if idempotency_key:
        check_idempotency_key(idempotency_key)
        return f"{site_id}:k:{idempotency_key}"
    if not timestamped:
        return f"{site_id}:r:{uuid4().hex}"
    digest = hashlib.sha256(body if isinstance(body, bytes) else body.encode())
    digest.update(repr(sorted((k, v) for k, v in options.items() if k != "now")).encode())
    return f"{site_id}:p:{digest.hexdigest()}"


def check_scope(exposition: Exposition, *, site_id: int) -> ScopeCheck | None:
    """The site scope of the exposition's GPU samples (batches.check_site_scope): the samples held
    back by claims are taken out of it; the check is returned when some were (else None)."""
    if not exposition.gpu_samples:
        return None
    scope = check_site_scope(GpuBatchIn(samples=exposition.gpu_samples), site_id=site_id)
    if not scope.held:
        return None
    exposition.gpu_samples = scope.samples
    return scope


def held_hosts(hostnames: set[str], *, site_id: int) -> dict[str, Any]:
    """The hosts among ``hostnames`` registered under another site, each recorded as this site's
    claim, once (fleet.telemetry.series.claim_foreign_nodes, as the writer would): hostname ->
    claims.Held."""
    return claim_foreign_nodes(site_id, hostnames) if hostnames else {}


def node_scope_check(held: dict[str, Any]) -> ScopeCheck | None:
    """The check the door answers with for ``held`` hosts (one claims.Held a host, field
    ``hostname``), or None when none was held."""
    return ScopeCheck(samples=[], held=list(held.values()), first_field="hostname") if held else None


def check_node_scope(expositions: Sequence[Exposition], *, site_id: int) -> ScopeCheck | None:
    """The site scope of the expositions' node_exporter series: the hosts of another site are
    claimed (held_hosts) and their series taken out, so that the door can say which hosts it held
    back; the check is returned when some were."""
    held = held_hosts({p.hostname for exposition in expositions for p in exposition.node}, site_id=site_id)
    for exposition in expositions if held else ():
        exposition.node = [p for p in exposition.node if p.hostname not in held]
    return node_scope_check(held)


def store_exposition(
    exposition: Exposition, *, site_id: int, batch_key: str, enqueued_at: datetime | None = None
) -> int:
    """Store one push's GPU samples, serving, node and scheduler series (store_expositions)."""
    return store_expositions([_Push(site_id, batch_key, exposition, enqueued_at)])


class _Push(NamedTuple):
    site_id: int
    key: str
    exposition: Exposition
    enqueued_at: datetime | None


def store_expositions(pushes: Sequence[Any]) -> int:
    """Store pushes (each with ``site_id``, ``key``, ``exposition``, ``enqueued_at``: a fold off
    the push queue); every part is idempotent under its own key, derived from the push's.

    The GPU samples of the fold go in one transaction (store_gpu_batches), as do the node
    series of each site: its ports, mounts and disks, one COPY a table for the whole fold. The
    serving and scheduler series (a few a push) are stored push by push."""
    stored = 0
    gpu = [
        PendingBatch(p.site_id, f"{p.key}:gpu", p.exposition.gpu_samples, p.enqueued_at)
        for p in pushes
        if p.exposition.gpu_samples
    ]
    if gpu:
        stored += store_gpu_batches(gpu)
    parts: dict[int, list[Part]] = {}
    for push in pushes:
        exposition, site_id = push.exposition, push.site_id
        if exposition.serving:
            stored += store_serving_points(site_id=site_id, batch_key=f"{push.key}:serving", points=exposition.serving)
        if exposition.scheduler:
            stored += store_queue_points(
                site_id=site_id, batch_key=f"{push.key}:scheduler", points=exposition.scheduler
            )
        ports = [p for p in exposition.node if p.source in ("infiniband", "netdev")]
        storage = [p for p in exposition.node if p.source in ("filesystem", "mountstats", "disk")]
        if ports:
            parts.setdefault(site_id, []).append(port_part(site_id=site_id, batch_key=f"{push.key}:port", points=ports))
        if storage:
            parts.setdefault(site_id, []).extend(
                storage_parts(site_id=site_id, batch_key=f"{push.key}:storage", points=storage)
            )
    for site_id, site_parts in parts.items():
        stored += store_parts(site_id=site_id, parts=site_parts)
    return stored
