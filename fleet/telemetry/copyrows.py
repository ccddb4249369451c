"""GPU samples as the writer COPYs them into fleet_gpusample, formatted once, where they are validated.

The JSON door formats each validated batch whose GPUs are all registered (the usual batch) into
binary COPY rows and queues those bytes with a small index: each row's GPU id, time and end.
The writer sends the bytes to PostgreSQL as they are, and takes each GPU's newest row out of them
for its state, without decoding a sample or formatting it again. The door had to build each
sample to validate it; the writer, one process draining every door in turn, is the ingest
path's bottleneck, and decoding and formatting again was half of its own time.

A batch that names a GPU not yet registered goes on as samples (``batches.encode_rows``): the
writer registers the GPU first, then formats the rows here itself.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate, chain
from operator import add, itemgetter
from typing import Any

import msgspec
from msgspec.structs import astuple

from console.pgcopy import format_rows
from fleet.telemetry.fields import GPU_SAMPLE_FIELDS, METRIC_NAMES, METRICS_END, METRICS_START, ts_of, uuid_of

SAMPLE_COLUMNS = ("gpu_id", "ts", *METRIC_NAMES)
# The sample table's own types: real, not double, for the floats (migration 0002).
SAMPLE_TYPES = ["int8", "timestamptz", *("float4" if f.kind is float else "int8" for f in GPU_SAMPLE_FIELDS)]
_metrics = itemgetter(slice(METRICS_START, METRICS_END))  # a sample's metrics from its astuple
_first = itemgetter(0)


def metric_values(sample: Any) -> tuple[Any, ...]:
    """The sample's metrics in METRIC_NAMES order (msgspec's astuple runs in C; the metrics sit
    together in the schema, at METRICS_START)."""
    return _metrics(astuple(sample))


class RowIndex(msgspec.Struct, array_like=True, gc=False):
    """Per row, in order: the GPU's id, the sample's time and where the row ends in the bytes."""

    gpu_ids: list[int]
    stamps: list[datetime]
    ends: list[int]


@dataclass(frozen=True)
class SampleRows:
    """A batch's samples as binary COPY rows (no signature or trailer) and their index."""

    data: bytes
    index: RowIndex

    def __len__(self) -> int:
        return len(self.index.gpu_ids)


_index_encoder = msgspec.msgpack.Encoder()
_index_decoder = msgspec.msgpack.Decoder(RowIndex)


def format_samples(gpu_ids: Sequence[int], samples: Sequence[Any]) -> SampleRows:
    """Validated samples (GpuSampleIn or GpuSampleRow) of the GPUs ``gpu_ids``, row for row.

    Each row, (gpu id, ts, *metrics), is built in C (``map`` over attrgetters) and formatted in
    C (``pgcopy.format_rows``): this runs for every sample."""
    stamps = list(map(ts_of, samples))
    rows = map(add, zip(gpu_ids, stamps, strict=True), map(_metrics, map(astuple, samples)))
    data, ends = format_rows(SAMPLE_TYPES, rows)
    return SampleRows(data, RowIndex(list(gpu_ids), stamps, ends))


def format_registered(samples: Sequence[Any], gpus: Mapping[str, tuple[int, int]]) -> SampleRows | None:
    """The samples as rows when every GPU they name is in ``gpus`` (uuid -> (id, site), as
    ``inventory.directory.gpus`` answers); None when one is not registered yet."""
    found = list(map(gpus.get, map(uuid_of, samples)))
    if None in found:
        return None
    return format_samples(list(map(_first, found)), samples)


def encode_index(index: RowIndex) -> bytes:
    return _index_encoder.encode(index)


def decode(data: bytes, index: bytes) -> SampleRows:
    """The writer's side of a queued batch; ValueError (a dead letter) when the parts disagree."""
    decoded = _index_decoder.decode(index)
    count, ends = len(decoded.gpu_ids), decoded.ends
    if len(decoded.stamps) != count or len(ends) != count or (ends[-1] if ends else 0) != len(data):
        raise ValueError(f"the row index ({count} rows) does not describe the {len(data)} bytes of rows")
    return SampleRows(data, decoded)


def without(rows: SampleRows, gpu_ids: Collection[int]) -> SampleRows:
    """The rows of every GPU but ``gpu_ids`` (another site's, raced at the edge)."""
    index, starts = rows.index, [0, *rows.index.ends]
    kept = [i for i, gpu_id in enumerate(index.gpu_ids) if gpu_id not in gpu_ids]
    data = b"".join(rows.data[starts[i] : starts[i + 1]] for i in kept)
    return SampleRows(
        data,
        RowIndex(
            [index.gpu_ids[i] for i in kept],
            [index.stamps[i] for i in kept],
            list(accumulate(starts[i + 1] - starts[i] for i in kept)),
        ),
    )


def newest_rows(batches: Sequence[SampleRows]) -> list[bytes]:
    """Each GPU's newest row across the batches (of two with one time, the later), in GPU id order.

    The ordering runs in C over the index (a stable sort on time, then a dict keeps each id's
    last position); only the rows picked, one a GPU, are visited in Python."""
    ids = list(chain.from_iterable(b.index.gpu_ids for b in batches))
    stamps = list(chain.from_iterable(b.index.stamps for b in batches))
    order = sorted(range(len(ids)), key=stamps.__getitem__)
    newest = dict(zip(map(ids.__getitem__, order), order, strict=True))
    bounds = list(accumulate(map(len, batches)))  # where each batch's rows end in the flat lists
    picked = []
    for gpu_id in sorted(newest):
        position = newest[gpu_id]
        n = bisect_right(bounds, position)
        row = position - (bounds[n - 1] if n else 0)
        ends = batches[n].index.ends
        picked.append(batches[n].data[ends[row - 1] if row else 0 : ends[row]])
    return picked
