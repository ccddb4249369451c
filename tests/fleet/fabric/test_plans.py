"""Repeat pushes read from a plan (fleet.ingest.plans): a push of a skeleton already seen gives
exactly what the full parse gives for the same text, values and errors alike, and anything off
the plain path is parsed in full."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.ingest import plans
from fleet.ingest.prometheus import parse_exposition
from fleet.validation import IngestError

from .node_exporter import FIXTURE, HOST

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
MS = int(NOW.timestamp() * 1000)


def stamped(text: str, ts_ms: int = MS, scale: float = 1.0) -> str:
    """The fixture with every sample line's value scaled and a timestamp added."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            out.append(line)
            continue
        series, value = line.rsplit(" ", 1)
        out.append(f"{series} {float(value) * scale!r} {ts_ms}")
    return "\n".join(out) + "\n"


def full(text: str, **options: object) -> object:
    """The full parse's answer (its Exposition, or its error as (status, message))."""
    plans.forget()
    return answer(text, **options)


def answer(text: str, **options: object) -> object:
    try:
        return parse_exposition(text, now=NOW, **options)  # type: ignore[arg-type]
    except IngestError as exc:
        return (exc.status, exc.message)


def planned(seen: str, text: str, **options: object) -> object:
    """The answer for ``text`` once a push of ``seen`` (the same skeleton) made the plan."""
    plans.forget()
    assert not isinstance(answer(seen, **options), tuple)
    return answer(text, **options)


@pytest.fixture(autouse=True)
def _no_plans_between_tests():
    plans.forget()
    yield
    plans.forget()


def test_a_repeat_push_is_read_from_the_plan_and_gives_the_full_parses_answer() -> None:
    first, second = stamped(FIXTURE), stamped(FIXTURE, MS + 15_000, scale=1.5)
    parsed = parse_exposition(first, hostname=HOST, now=NOW)
    key = plans.skeleton(second, f"{HOST}\x00None\x00auto").key  # type: ignore[union-attr]
    assert plans._plans[key] is not None  # the first push made a plan for this skeleton
    again = parse_exposition(second, hostname=HOST, now=NOW)
    assert again == full(second, hostname=HOST)
    assert again.node and again.ignored == parsed.ignored and again.ignored_metrics == parsed.ignored_metrics
    assert {p.value for p in again.node} != {p.value for p in parsed.node}  # the new values, not the plan's


def test_the_plan_is_per_option_a_hostname_pushed_for_another_node_is_parsed_afresh() -> None:
    text = stamped(FIXTURE)
    parse_exposition(text, hostname=HOST, now=NOW)
    other = parse_exposition(text, hostname="gpu-b-001", now=NOW)
    assert {p.hostname for p in other.node} == {"gpu-b-001"}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda v, ts: f"{v} {ts} 7", "a third token"),
        (lambda v, ts: f"{v}\t{ts}", "a tab"),
        (lambda v, ts: f"1_000 {ts}", "an underscore, which float() would take"),
        (lambda v, ts: f"twelve {ts}", "not a number"),
        (lambda v, ts: f"{v} {ts + 3_600_000}", "a timestamp an hour ahead"),
        (lambda v, ts: f"{v} {ts - 30 * 86_400_000}", "a timestamp a month old"),
        (lambda v, ts: f"{v} 1e400", "a timestamp past a float"),
        (lambda v, ts: "", "no value"),
        (lambda v, ts: f"NaN {ts}", "NaN: ignored"),
        (lambda v, ts: f"-5 {ts}", "a negative counter: ignored"),
        (lambda v, ts: f"+Inf {ts}", "infinity: ignored"),
        (lambda v, ts: f"{v}", "no timestamp"),
        (lambda v, ts: f"  {v}   {ts}  ", "extra spaces"),
        (lambda v, ts: f"0x10 {ts}", "hex"),
        (lambda v, ts: f"{v} {ts}.5", "a fractional timestamp"),
    ],
)
def test_a_line_off_the_plain_path_gets_the_full_parses_answer(change, why: str) -> None:  # type: ignore[no-untyped-def]
    seen = stamped(FIXTURE)
    lines = seen.splitlines()
    target = next(i for i, line in enumerate(lines) if line.startswith("node_infiniband_link_downed_total"))
    series, value, ts = lines[target].rsplit(" ", 2)
    lines[target] = f"{series} {change(value, int(ts))}".rstrip() if change(value, int(ts)) else series
    text = "\n".join(lines) + "\n"
    assert planned(seen, text, hostname=HOST) == full(text, hostname=HOST), why


def test_an_error_names_the_same_line_either_way() -> None:
    seen = stamped(FIXTURE)
    lines = seen.splitlines()
    target = next(i for i, line in enumerate(lines) if line.startswith("node_infiniband_state_id"))
    lines[target] = lines[target].replace(f" {MS}", f" {MS - 40 * 86_400_000}")
    late = "\n".join(lines) + "\n"
    got = planned(seen, late, hostname=HOST)
    assert isinstance(got, tuple) and got[0] == 400 and got[1].startswith(f"line {target + 1}: the timestamp")
    assert got == full(late, hostname=HOST)


def test_a_label_value_holding_a_brace_is_never_planned() -> None:
    text = stamped(FIXTURE).replace('mountpoint="/mnt/datasets"', 'mountpoint="/mnt/data}sets"')
    first = parse_exposition(text, hostname=HOST, now=NOW)
    key = plans.skeleton(text, f"{HOST}\x00None\x00auto").key  # type: ignore[union-attr]
    assert plans._plans[key] is None
    assert parse_exposition(text, hostname=HOST, now=NOW) == first
    assert any(p.mountpoint == "/mnt/data}sets" for p in first.node)


def test_gpu_and_serving_pushes_are_never_planned() -> None:
    text = (
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000001",Hostname="{HOST}"}} 87 {MS}\n'
    )
    first = parse_exposition(text, now=NOW)
    key = plans.skeleton(text, "None\x00None\x00auto").key  # type: ignore[union-attr]
    assert plans._plans[key] is None and len(first.gpu_samples) == 1
    assert parse_exposition(text, now=NOW) == first


def test_past_the_lines_kept_every_plan_is_dropped_and_built_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    text = stamped(FIXTURE)
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    monkeypatch.setattr(plans, "MAX_LINES_KEPT", samples + samples // 2)
    parse_exposition(text, hostname=HOST, now=NOW)
    assert len(plans._plans) == 1
    parse_exposition(text, hostname="gpu-b-001", now=NOW)  # over the bound: the first plan goes
    assert len(plans._plans) == 1 and plans._lines_kept == samples
    assert {p.hostname for p in parse_exposition(text, hostname="gpu-b-001", now=NOW).node} == {"gpu-b-001"}


# What a line's value and timestamp may be: numbers as exporters print them and text that is not.
TOKENS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1_0", "0x1", "1e5", " ", "\t", "٣", "1.5e-3", "", "# x"]),
)
STAMPS = st.one_of(
    st.integers(min_value=MS - 2 * 86_400_000, max_value=MS + 120_000).map(str),
    st.sampled_from(["", "1e3", "abc", "-1", f"{MS}.25", f"{MS} 5"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_values_on_a_seen_skeleton_give_what_the_full_parse_gives(data: st.DataObject) -> None:
    seen = stamped(FIXTURE)
    lines = seen.splitlines()
    samples = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
    for i in data.draw(st.lists(st.sampled_from(samples), min_size=1, max_size=6, unique=True)):
        series = lines[i].rsplit(" ", 2)[0]
        lines[i] = f"{series} {data.draw(TOKENS)} {data.draw(STAMPS)}".rstrip(" ")
    text = "\n".join(lines) + "\n"
    assert planned(seen, text, hostname=HOST) == full(text, hostname=HOST)


def test_a_push_with_the_clock_moved_on_still_reads_its_own_times() -> None:
    """The time check is the door's receive window, not the plan's: the same skeleton a day
    later is checked against that day."""
    seen = stamped(FIXTURE)
    parse_exposition(seen, hostname=HOST, now=NOW)
    later_ms = MS + 86_400_000
    later = parse_exposition(stamped(FIXTURE, later_ms), hostname=HOST, now=NOW + timedelta(days=1))
    assert {p.ts for p in later.node} == {datetime.fromtimestamp(later_ms / 1000, UTC)}


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_a_push_past_the_line_limit_is_refused_whole_with_its_count(monkeypatch, trailing_newline: bool) -> None:  # type: ignore[no-untyped-def]
    from fleet.ingest import prometheus

    text = stamped(FIXTURE)
    lines = len(text.split("\n")) - 1  # the fixture ends with a newline
    body = text if trailing_newline else text.rstrip("\n")
    monkeypatch.setattr(prometheus, "MAX_LINES", lines)
    assert not isinstance(answer(body, hostname=HOST), tuple)  # exactly at the limit
    monkeypatch.setattr(prometheus, "MAX_LINES", lines - 1)
    assert answer(body, hostname=HOST) == (413, f"The exposition has {lines} lines; at most {lines - 1}.")
