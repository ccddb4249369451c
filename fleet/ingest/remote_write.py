"""Prometheus remote_write (protocol 1.0): a snappy-compressed protobuf ``WriteRequest`` in, the
text door's mapping out.

The request is decoded and written back as Prometheus text exposition, one exposition per
timestamp (one scrape of one target is one timestamp, so one GPU's fields stay one sample), every
line carrying its timestamp. Each exposition then goes through ``parse_exposition`` and the push
queue exactly as a text push does: the same dcgm/vLLM/Triton/TGI mapping, the same checks, the
same worker task, and a batch key that is a hash of the exposition, so a request retried by
Prometheus stores nothing twice.

The WriteRequest messages are built at runtime from a FileDescriptorProto (the fields of
prometheus/prompb/remote.proto and types.proto this door reads): no protoc step and no generated
module tied to one protobuf runtime. Fields left out (metadata, exemplars, native histograms) are
skipped by the parser as unknown fields.
"""

from __future__ import annotations

import math
import re
import struct
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from typing import Any

import cramjam
from django.conf import settings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from fleet.ingest.prometheus import _escape
from fleet.validation import IngestError

# Prometheus marks a series gone (target down, series vanished) with this NaN: not a reading.
STALE_NAN_BITS = 0x7FF0000000000002
METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
PROTOCOL_VERSION = "0.1.0"  # X-Prometheus-Remote-Write-Version of protocol 1.0
LINE_ERROR = re.compile(r"^line (\d+): ")
# Snappy's densest element copies 64 bytes for 3: no real body inflates more than about 21 times.
SNAPPY_MAX_RATIO = 32


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
    """One timestamp's samples as a text exposition; ``origins[n]`` names the series of line n+1."""

    text: str
    origins: list[tuple[int, str]]  # (index in WriteRequest.timeseries, metric name)

    def translated(self, exc: IngestError) -> IngestError:
        """The text door's "line N" error, told in terms of the WriteRequest's series."""
        match = LINE_ERROR.match(exc.message)
        if not match or not 1 <= int(match.group(1)) <= len(self.origins):
            return exc
        index, name = self.origins[int(match.group(1)) - 1]
        message = f"timeseries[{index}] ({name}): {exc.message[match.end() :]}"
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


def decode(body: bytes) -> list[Chunk]:
    """The request's samples as text expositions, one per timestamp, in timestamp order."""
    raw = decompress(body)
    request = write_request_class()()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise IngestError(400, f"The body is not a protobuf prometheus.WriteRequest ({exc}).", field="body") from None
    by_time: dict[int, list[tuple[str, int, str]]] = defaultdict(list)  # ts -> (line, series index, name)
    for index, series in enumerate(request.timeseries):
        labels: dict[str, str] = {}
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
        name = labels.pop("__name__", "")
        if not name:
            raise IngestError(400, f"timeseries[{index}] has no __name__ label.", item=index, field="__name__")
        if not METRIC_NAME_RE.fullmatch(name):
            raise IngestError(
                400, f"timeseries[{index}]: metric name {name[:100]!r} is not valid.", item=index, field="__name__"
            )
        rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        head = f"{name}{{{rendered}}}" if rendered else name
        for sample in series.samples:
            if struct.unpack("<Q", struct.pack("<d", sample.value))[0] == STALE_NAN_BITS:
                continue  # a staleness marker: the series ended, there is no reading
            by_time[sample.timestamp].append((f"{head} {_value(sample.value)} {sample.timestamp}", index, name))
    chunks = []
    for timestamp in sorted(by_time):
        lines = sorted(by_time[timestamp])
        chunks.append(Chunk("".join(f"{line}\n" for line, _, _ in lines), [(i, n) for _, i, n in lines]))
    return chunks


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
