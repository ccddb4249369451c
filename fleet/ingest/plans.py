"""Repeat pushes read without the parser: what a push's series became, kept by the push's shape.

A node_exporter, or a Prometheus relabelling and forwarding its scrapes, sends the same series
every scrape; only the values and the timestamps change. prometheus_client's parser reads every
line afresh (about 25 µs a value, most of a node push's cost at the door), and the door then
decides the same thing for the same series: which collector, which port or mount, stored or
ignored.

So the door keeps a *plan* per push *skeleton*: the push's comment lines and each sample line's
series text (name and labels, exactly as written), in order, with the door's options. The first
push of a skeleton is parsed in full (``parse_exposition``); when it held only node series and
series the console ignores, what each sample line became is kept. A later push of the same
skeleton reads each line's value and timestamp only, and applies the plan.

The plan only repeats what the full parse decided for the same text. Anything off the plain
path goes to the full parse, which answers, and words any error, as before: a tab or a third
token after the series, a value with an underscore or one Python does not read, a timestamp
outside the window, a series text whose label values hold a brace (the parser's split would then
be another than ours). Values are read as the parser reads them (an integer first, else a float;
a timestamp in milliseconds).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from fleet.telemetry.series import NodePoint
from fleet.validation import IngestError

# What one sample line became: (name, node series or None, the node's fields or None).
# node series None: a series the console ignores (counted in ``ignored``, no time check);
# fields None on a node series: ignored after its timestamp was checked (the loopback
# interface, another NFS operation); else (hostname, source, quantity, device, port,
# mountpoint, fstype, is_counter).
Entry = tuple[str, bool, tuple[Any, ...] | None]
Plan = tuple[Entry, ...]

# Plans kept (about 200 bytes a line, their names interned): past this many lines in all, the lot
# is dropped and built again as pushes come (a push parsed in full costs what every push cost
# before). 1,000 node_exporters of ~100 series each hold about half of it.
MAX_LINES_KEPT = 200_000
# A push of more lines than this is parsed in full every time, never planned: its skeleton and
# what each line became would cost more than a plan saves (node_exporter sends a few hundred to a
# few thousand lines a host; a relay of a few dozen hosts stays under it).
MAX_PUSH_LINES = MAX_LINES_KEPT // 10

_plans: dict[bytes, Plan | None] = {}  # None: a skeleton whose push cannot be planned
_lines_kept = 0


class Skeleton:
    """A push split into its skeleton's key and each sample line's text after the series."""

    __slots__ = ("key", "rests")

    def __init__(self, key: bytes, rests: list[str]) -> None:
        self.key = key
        self.rests = rests


def skeleton(text: str, options: str) -> Skeleton | None:
    """The push's skeleton, or None when a line is off the plain path (it is parsed in full)."""
    parts = [options]
    rests = []
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts.append(line)
            continue
        brace = line.find("{")
        if brace == -1:
            end = line.find(" ")
            if end == -1:
                return None
        else:
            end = line.rfind("}") + 1
            if end == 0:
                return None
        parts.append(line[:end])
        rests.append(line[end:])
    key = hashlib.blake2b("\n".join(parts).encode(), digest_size=16).digest()
    return Skeleton(key, rests)


def plain_series(line: str) -> bool:
    """Is this sample line's series split by ``skeleton`` where the parser splits it? The parser
    ends the labels at the first unquoted ``}`` (one ``}`` in all, closing the series, makes that
    ours) and reads a name without labels up to a space or tab."""
    brace = line.find("{")
    if brace == -1:
        end = line.find(" ")
        return end > 0 and "\t" not in line[:end]
    series = line[: line.rfind("}") + 1]
    return series.count("}") == 1 and " " not in series[:brace] and "\t" not in series[:brace]


def read(
    shape: Skeleton,
    out: Any,
    *,
    time_of: Callable[[float | None, int], datetime],
    magnitude: float,
) -> bool:
    """Fill ``out`` (an Exposition) from the skeleton's plan; False when there is none or a
    line is off the plain path (``out`` is then to be thrown away). A value past ``magnitude``
    (NaN and infinities included: they compare false) is ignored, as the full parse ignores it.

    A value or timestamp is read with ``float``: the parser reads an integer first, else a float,
    and ``float`` gives the same number for every text ``int`` reads (an underscore, which
    ``float`` would also take, sends the push to the parser, which refuses it)."""
    plan = _plans.get(shape.key)
    if plan is None or len(plan) != len(shape.rests):
        return False
    node = out.node
    timestamped = True
    last_stamp: float | None = None
    last_ts: datetime | None = None
    for number, ((name, is_node, fields), rest) in enumerate(zip(plan, shape.rests, strict=True), start=1):
        # Every line's value and timestamp must read as numbers (the parser refuses the push
        # otherwise), the ignored series' too; only a node series' time is checked.
        if "\t" in rest or "_" in rest:
            return False
        tokens = rest.split(" ")
        if len(tokens) != 3 or tokens[0] or not tokens[1] or not tokens[2]:
            tokens = [t for t in tokens if t]
            if not 0 < len(tokens) < 3:
                return False
        else:
            del tokens[0]
        try:
            value = float(tokens[0])
            stamp = float(tokens[1]) / 1000 if len(tokens) == 2 else None
            if not is_node:
                out.ignore(name)
                continue
            if stamp != last_stamp or last_ts is None:
                # The line number only words an error, and an error goes to the full parse.
                last_stamp, last_ts = stamp, time_of(stamp, number)
        except (ValueError, OverflowError, IngestError):
            return False
        if fields is None or not -magnitude <= value <= magnitude or (fields[7] and value < 0):
            out.ignore(name)
            continue
        timestamped &= stamp is not None
        node.append(
            NodePoint(fields[0], fields[1], fields[2], last_ts, value, fields[3], fields[4], fields[5], fields[6])
        )
    out.timestamped = timestamped and bool(node)
    return True


class Recorder:
    """What a full parse decided for each sample line, by line number, to keep as a plan; nothing
    once the push cannot be planned (``plannable`` False)."""

    __slots__ = ("entries", "plannable")

    def __init__(self, *, plannable: bool = True) -> None:
        self.entries: dict[int, Entry] = {}
        self.plannable = plannable

    def ignored(self, line: int, name: str) -> None:
        if self.plannable:
            self.entries[line] = (name, False, None)

    def node(self, line: int, name: str, fields: tuple[Any, ...] | None) -> None:
        if self.plannable:
            self.entries[line] = (name, True, fields)

    def other(self) -> None:
        """A GPU, serving or scheduler sample: read across lines, never planned."""
        self.plannable = False
        self.entries.clear()


def keep(shape: Skeleton, recorder: Recorder, lines: Sequence[str], sample_lines: Sequence[int]) -> None:
    """Keep the plan a full parse recorded for this skeleton (or that it has none)."""
    global _lines_kept
    plan: Plan | None = None
    counts_agree = len(sample_lines) == len(shape.rests) == len(recorder.entries)
    if recorder.plannable and counts_agree and all(plain_series(lines[n - 1].strip()) for n in sample_lines):
        plan = tuple(_interned(recorder.entries[n]) for n in sample_lines)
    size = len(plan) if plan else 1
    if _lines_kept + size > MAX_LINES_KEPT:
        forget()
    _plans[shape.key] = plan
    _lines_kept += size


def _interned(entry: Entry) -> Entry:
    """The entry with its names interned: a node's hostname, a metric's name and a device are
    held once however many lines name them."""
    name, is_node, fields = entry
    if fields is not None:
        fields = tuple(sys.intern(f) if isinstance(f, str) else f for f in fields)
    return sys.intern(name), is_node, fields


def forget() -> None:
    """Drop every plan (they are rebuilt as pushes come)."""
    global _lines_kept
    _plans.clear()
    _lines_kept = 0
