"""Prometheus remote_write (protocol 1.0): a snappy-compressed protobuf ``WriteRequest`` in, the
text door's mapping out.

The request is decoded and written back as Prometheus text exposition, one exposition per
timestamp (one scrape of one target is one timestamp, so one GPU's fields stay one sample), every
line carrying its timestamp. Each exposition then goes through ``parse_exposition`` and the push
queue exactly as a text push does: the same dcgm/vLLM/Triton/TGI mapping, the same checks, the
same worker task, and a batch key that is a hash of the exposition, so a request retried by
Prometheus stores nothing twice.

Every sample becomes a line that carries all its series' labels, so a small request can stand for
a great deal of text (one series with a 10 KB label and 60,000 samples is 300 KB on the wire and
600 MB as text). ``read`` therefore bounds what a request expands to before any text is built:
a series' labels (``REMOTE_WRITE_MAX_LABEL_BYTES``, a 400 naming the series and its longest
label), the text all its samples come to (``INGEST_MAX_BYTES``, a text push's own limit), its
timestamps (``MAX_TIMESTAMPS``: each is a push for the writers) and the samples at one timestamp
(a text push's ``MAX_LINES``), a 413 naming the series that weighs most where there is one. The
expositions are then rendered one at a time (``Decoded.chunks``), and only their parse is kept.

The WriteRequest messages are built at runtime from a FileDescriptorProto (the fields of
prometheus/prompb/remote.proto and types.proto this door reads): no protoc step and no generated
module tied to one protobuf runtime. Fields left out (metadata, exemplars, native histograms) are
skipped by the parser as unknown fields.
"""

from __future__ import annotations

import math
import re
import struct
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import cramjam
from django.conf import settings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from fleet.ingest.prometheus import MAX_LINES, _escape
from fleet.validation import IngestError

# Prometheus marks a series gone (target down, series vanished) with this NaN: not a reading.
STALE_NAN_BITS = 0x7FF0000000000002
METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
PROTOCOL_VERSION = "0.1.0"  # X-Prometheus-Remote-Write-Version of protocol 1.0
LINE_ERROR = re.compile(r"^line (\d+): ")
# Snappy's densest element copies 64 bytes for 3: no real body inflates more than about 21 times.
SNAPPY_MAX_RATIO = 32
# Each timestamp is an exposition parsed, checked and queued on its own (a push for the writers,
# counted against GOODPUT_INGEST_QUEUE_BOUND). Prometheus sends at most max_samples_per_send
# samples a request (2,000 by default): a request of one sample a timestamp still fits.
MAX_TIMESTAMPS = 2_000


@cache
def _messages() -> dict[str, Any]:
    """The prompb messages this door reads, field numbers as in prometheus/prompb."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="goodput/prompb_remote.proto", package="prometheus", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> None:
        m = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name

    optional, repeated = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    message("Label", ("name", 1, f.TYPE_STRING, optional, None), ("value", 2, f.TYPE_STRING, optional, None))
    message("Sample", ("value", 1, f.TYPE_DOUBLE, optional, None), ("timestamp", 2, f.TYPE_INT64, optional, None))
    message(
        "TimeSeries",
        ("labels", 1, f.TYPE_MESSAGE, repeated, ".prometheus.Label"),
        ("samples", 2, f.TYPE_MESSAGE, repeated, ".prometheus.Sample"),
    )
    message("WriteRequest", ("timeseries", 1, f.TYPE_MESSAGE, repeated, ".prometheus.TimeSeries"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{name}"))
        for name in ("Label", "Sample", "TimeSeries", "WriteRequest")
    }


def write_request_class() -> Any:
    """The ``prometheus.WriteRequest`` message class (for senders and tests)."""
    return _messages()["WriteRequest"]


def encode(series: list[tuple[dict[str, str], list[tuple[float, int]]]]) -> bytes:
    """A snappy-compressed WriteRequest from (labels, [(value, timestamp ms)]) pairs, as Prometheus
    sends it (used by the tests and by anyone replaying a capture)."""
    request = write_request_class()()
    for labels, samples in series:
        ts = request.timeseries.add()
        for name, value in sorted(labels.items()):
            ts.labels.add(name=name, value=value)
        for value, timestamp in samples:
            ts.samples.add(value=value, timestamp=timestamp)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


@dataclass
class Chunk:
    """One timestamp's samples as a text exposition; line n+1 is a sample of series
    ``origins[n]`` (its index in WriteRequest.timeseries), whose metric is ``names[origins[n]]``."""

    text: str
    origins: array[int]
    names: list[str]

    def translated(self, exc: IngestError) -> IngestError:
        """The text door's "line N" error, told in terms of the WriteRequest's series."""
        match = LINE_ERROR.match(exc.message)
        if not match or not 1 <= int(match.group(1)) <= len(self.origins):
            return exc
        index = self.origins[int(match.group(1)) - 1]
        message = f"timeseries[{index}] ({self.names[index]}): {exc.message[match.end() :]}"
        return IngestError(exc.status, message, item=index, field=exc.field)


def _uncompressed_length(body: bytes) -> int:
    """The length snappy's block format declares in its varint header."""
    length = shift = 0
    for position, byte in enumerate(body[:10]):
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return length
        shift += 7
        if position == 9:
            break
    raise IngestError(400, "The body is not snappy-compressed (block format): no length header.", field="body")


def decompress(body: bytes) -> bytes:
    """Snappy block format, as remote_write sends it; 400 naming snappy, 413 past the byte limit
    before anything is inflated."""
    if not body:
        raise IngestError(400, "The body is empty; remote_write sends a snappy-compressed WriteRequest.", field="body")
    declared = _uncompressed_length(body)
    if declared > len(body) * SNAPPY_MAX_RATIO:
        raise IngestError(
            400,
            f"The body is not snappy-compressed (block format) data: it declares {declared} bytes from {len(body)}.",
            field="body",
        )
    if declared > settings.INGEST_MAX_BYTES:
        raise IngestError(
            413, f"The WriteRequest is {declared} bytes uncompressed; the limit is {settings.INGEST_MAX_BYTES} bytes."
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise IngestError(400, f"The body is not snappy-compressed (block format) data: {exc}.", field="body") from None


class Decoded:
    """A WriteRequest checked whole and within its bounds: each series' labels rendered once, its
    samples indexed by timestamp; ``chunks`` renders one timestamp's exposition at a time."""

    def __init__(self, heads: list[str], names: list[str], by_time: dict[int, tuple[array[int], array[float]]]):
        self.heads = heads  # the series' text ("name{labels}"), by index in WriteRequest.timeseries
        self.names = names
        self.by_time = by_time  # timestamp -> (series indices, values)

    def __len__(self) -> int:
        return len(self.by_time)

    def chunks(self) -> Iterator[Chunk]:
        """Each timestamp's samples as a text exposition, in timestamp order, lines sorted; once
        (what is rendered goes as soon as it is no longer needed, the heads with the last one)."""
        heads = self.heads
        for timestamp in sorted(self.by_time):
            series, values = self.by_time.pop(timestamp)
            lines = [f"{heads[i]} {_value(v)} {timestamp}\n" for i, v in zip(series, values, strict=True)]
            if not self.by_time:
                heads.clear()
            # Sorted by their text (two equal lines: by series, as listed). No line is the start
            # of another (a head ends at its only unescaped brace), so the newline sorts alike.
            order = sorted(range(len(lines)), key=lines.__getitem__)
            chunk = Chunk("".join([lines[n] for n in order]), array("l", (series[n] for n in order)), self.names)
            del lines, order, series, values
            yield chunk
            del chunk


def decode(body: bytes) -> list[Chunk]:
    """The request's samples as text expositions, one per timestamp, in timestamp order."""
    return list(read(body).chunks())


def read(body: bytes) -> Decoded:
    """Decompress, decode and check the whole request (400 naming the series and label at fault,
    413 past a bound) before any of its text is built."""
    raw = decompress(body)
    request = write_request_class()()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise IngestError(400, f"The body is not a protobuf prometheus.WriteRequest ({exc}).", field="body") from None
    del raw
    heads: list[str] = []
    names: list[str] = []
    by_time: dict[int, tuple[array[int], array[float]]] = {}
    text_bytes = 0  # the expositions' size, counted as the samples are indexed
    heaviest = (0, 0)  # (text bytes, series index) of the series that weighs most
    for index, series in enumerate(request.timeseries):
        name, head = _series_text(index, series)
        heads.append(head)
        names.append(sys.intern(name))  # a request names a few metrics many times
        line_bytes = len(head.encode()) + 3  # the head, two spaces and the newline of each line
        weight = 0
        for sample in series.samples:
            value, timestamp = sample.value, sample.timestamp
            if struct.unpack("<Q", struct.pack("<d", value))[0] == STALE_NAN_BITS:
                continue  # a staleness marker: the series ended, there is no reading
            weight += line_bytes + len(_value(value)) + len(str(timestamp))
            at = by_time.get(timestamp)
            if at is None:
                if len(by_time) == MAX_TIMESTAMPS:
                    raise _too_many_timestamps(index, name)
                at = by_time[timestamp] = (array("l"), array("d"))
            at[0].append(index)
            at[1].append(value)
            if text_bytes + weight > settings.INGEST_MAX_BYTES:
                raise _too_much_text(max(heaviest, (weight, index)), names, heads)
        text_bytes += weight
        heaviest = max(heaviest, (weight, index))
    for timestamp, (series_at, _) in by_time.items():
        if len(series_at) > MAX_LINES:
            raise IngestError(
                413,
                f"The WriteRequest holds {len(series_at):,} samples at {timestamp} ms, each a line of that "
                f"timestamp's exposition; at most {MAX_LINES:,}, as a text push's lines.",
                field="samples",
            )
    return Decoded(heads, names, by_time)  # the decoded message goes: its samples are indexed


def _series_text(index: int, series: Any) -> tuple[str, str]:
    """The series' metric name and its text (``name{labels}``, as the text door reads it), its
    labels checked: valid names, each once, within REMOTE_WRITE_MAX_LABEL_BYTES together."""
    labels: dict[str, str] = {}
    size = 0
    longest = ("", 0)  # (label, bytes)
    for label in series.labels:
        if not LABEL_NAME_RE.fullmatch(label.name):
            raise IngestError(
                400,
                f"timeseries[{index}]: label name {label.name[:100]!r} is not valid.",
                item=index,
                field="labels",
            )
        if label.name in labels:
            raise IngestError(400, f"timeseries[{index}]: label {label.name} twice.", item=index, field=label.name)
        labels[label.name] = label.value
        weight = len(label.name.encode()) + len(label.value.encode())
        size += weight
        longest = max(longest, (label.name, weight), key=lambda pair: pair[1])
    limit = settings.REMOTE_WRITE_MAX_LABEL_BYTES
    if size > limit:
        shown = labels.get("__name__", "")[:100] or "no __name__"
        raise IngestError(
            400,
            f"timeseries[{index}] ({shown}): its labels come to {size:,} bytes, label {longest[0]} alone "
            f"{longest[1]:,}; at most {limit:,} a series (GOODPUT_REMOTE_WRITE_MAX_LABEL_BYTES). Drop or "
            "shorten it with write_relabel_configs.",
            item=index,
            field=longest[0],
        )
    name = labels.pop("__name__", "")
    if not name:
        raise IngestError(400, f"timeseries[{index}] has no __name__ label.", item=index, field="__name__")
    if not METRIC_NAME_RE.fullmatch(name):
        raise IngestError(
            400, f"timeseries[{index}]: metric name {name[:100]!r} is not valid.", item=index, field="__name__"
        )
    rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return name, f"{name}{{{rendered}}}" if rendered else name


def _too_much_text(heaviest: tuple[int, int], names: list[str], heads: list[str]) -> IngestError:
    weight, index = heaviest
    return IngestError(
        413,
        f"The WriteRequest comes to more than {settings.INGEST_MAX_BYTES:,} bytes as text exposition, a text "
        "push's limit (GOODPUT_INGEST_MAX_BYTES): each sample is a line carrying its series' labels, and "
        f"timeseries[{index}] ({names[index][:100]}) alone comes to {weight:,} bytes "
        f"({len(heads[index].encode()):,} bytes of labels a sample). Send fewer samples a request "
        "(queue_config.max_samples_per_send) or fewer labels (write_relabel_configs).",
        item=index,
        field="samples",
    )


def _too_many_timestamps(index: int, name: str) -> IngestError:
    return IngestError(
        413,
        f"The WriteRequest holds samples of more than {MAX_TIMESTAMPS:,} timestamps (timeseries[{index}] "
        f"({name[:100]}) brings one more); each is a push of its own. Send fewer samples a request "
        "(queue_config.max_samples_per_send).",
        item=index,
        field="samples",
    )


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
