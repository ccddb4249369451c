"""The fleet page's figures are computed about once every FLEET_SUMMARY_SECONDS for every reader
(console.figures.fresh): a read within it is a cache lookup; an expired value is still answered while
one caller recomputes it in the background (run in place here, where the test's transaction is
the only one that sees its data); a push's rows are written back for the reads; a cache that
cannot be reached costs a computation, not an error."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from redis.exceptions import ConnectionError as RedisConnectionError

from console import figures
from fleet.telemetry.read import fleet_summary, gpu_list
from tests.conftest import make_sample, post_batch


@pytest.fixture
def kept(settings, monkeypatch):  # type: ignore[no-untyped-def]
    """FLEET_SUMMARY_SECONDS = 5 on an empty cache, and a clock the test moves."""
    settings.FLEET_SUMMARY_SECONDS = 5
    cache.clear()
    clock = {"now": 1_000_000.0}
    monkeypatch.setattr(figures, "_clock", lambda: clock["now"])
    clock["background"] = []
    monkeypatch.setattr(figures, "_in_background", lambda work: (clock["background"].append(1), work()))
    yield clock
    cache.clear()


def _report(client, token, uuid: str, temp: float) -> None:  # type: ignore[no-untyped-def]
    sample = make_sample(gpu_uuid=uuid, hostname="gpu-a-001", gpu_index=0, gpu_temp_c=temp)
    assert post_batch(client, token, {"samples": [sample]}).status_code == 202


def test_within_the_interval_a_read_is_the_kept_value_then_it_is_recomputed(kept, client, token_a) -> None:
    calls = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert figures.fresh("x", compute) == 1
    kept["now"] += 4.9
    assert figures.fresh("x", compute) == 1 and len(calls) == 1  # kept
    kept["now"] += 0.2
    assert figures.fresh("x", compute) == 1  # expired: answered, and recomputed behind the answer
    assert kept["background"] == [1] and len(calls) == 2
    assert figures.fresh("x", compute) == 2 and len(calls) == 2


def test_the_overview_reads_its_figures_once_an_interval(kept, viewer_client, client, token_a) -> None:
    _report(client, token_a, "GPU-cache-0001", 60.0)
    first = viewer_client.get("/api/v1/fleet/overview/").json()
    assert first["totals"]["max_temp"] == 60.0
    _report(client, token_a, "GPU-cache-0001", 71.0)
    kept["now"] += 1
    assert viewer_client.get("/api/v1/fleet/overview/").json()["totals"]["max_temp"] == 60.0  # as of 1 s ago
    kept["now"] += 5
    assert viewer_client.get("/api/v1/fleet/overview/").json()["totals"]["max_temp"] == 60.0  # recomputing
    again = viewer_client.get("/api/v1/fleet/overview/").json()
    assert again["totals"]["max_temp"] == 71.0 and again["sites"][0]["max_temp"] == 71.0


def test_an_expired_value_is_served_while_another_caller_recomputes_it(kept) -> None:
    figures.fresh("y", lambda: "old")
    kept["now"] += 10
    assert cache.add("figures:y:lock", 1)  # another process took the recomputation
    assert figures.fresh("y", lambda: pytest.fail("computed twice")) == "old"
    cache.delete("figures:y:lock")  # it finished (without writing, say): the next caller does it
    assert figures.fresh("y", lambda: "new") == "old" and kept["background"] == [1]
    assert cache.get("figures:y:lock") is None  # released
    assert figures.fresh("y", lambda: pytest.fail("computed again")) == "new"


def test_a_first_read_computes_in_place_and_a_failed_recomputation_keeps_the_old_value(kept) -> None:
    assert figures.fresh("w", lambda: "first") == "first" and kept["background"] == []
    kept["now"] += 10

    def broken() -> str:
        raise RuntimeError("a bug")

    assert figures.fresh("w", broken) == "first"  # logged, not raised to the reader
    assert cache.get("figures:w:lock") is None
    assert figures.fresh("w", lambda: "second") == "first"  # tried again by the next reader
    assert figures.fresh("w", lambda: "third") == "second"


def test_a_view_push_writes_its_rows_back_for_the_reads(kept, client, token_a) -> None:
    _report(client, token_a, "GPU-cache-0002", 55.0)
    query = gpu_list.parse_query({"size": "5"})
    topic = fleet_summary.watch_view(query)
    assert fleet_summary.table_snapshot(query)["gpus"][0]["temp"] == 55.0
    _report(client, token_a, "GPU-cache-0002", 66.0)
    pushed, _ = fleet_summary.build_view_delta(topic, None)  # the push computes afresh, at once
    assert pushed is not None and pushed["gpus"][0]["temp"] == 66.0
    assert fleet_summary.table_snapshot(query)["gpus"][0]["temp"] == 66.0  # and the reads get its rows


def test_a_cache_that_cannot_be_reached_costs_a_computation(kept, monkeypatch) -> None:
    class Down:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            def down(*args, **kwargs):  # type: ignore[no-untyped-def]
                raise RedisConnectionError("Redis is restarting")

            return down

    monkeypatch.setattr(figures, "cache", Down())
    assert figures.fresh("z", lambda: 42) == 42


@pytest.mark.django_db(transaction=True)  # the background thread reads committed rows on its own connection
def test_the_recomputation_runs_on_a_thread_of_its_own(settings, monkeypatch) -> None:
    import threading
    import time

    from fleet.inventory.models import Site

    settings.FLEET_SUMMARY_SECONDS = 5
    cache.clear()
    clock = {"now": 2_000_000.0}
    monkeypatch.setattr(figures, "_clock", lambda: clock["now"])
    threads = []

    def count() -> tuple[int, str]:
        threads.append(threading.current_thread().name)
        return Site.objects.count(), threading.current_thread().name

    before = figures.fresh("sites-count", count)
    Site.objects.create(name="late-site", region="eu")
    clock["now"] += 6
    assert figures.fresh("sites-count", count) == before  # answered at once
    deadline = time.monotonic() + 10
    while figures.fresh("sites-count", count) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    after = figures.fresh("sites-count", count)
    assert after == (before[0] + 1, "figures") and threads[-1] == "figures"
    cache.clear()


def test_a_preset_range_s_series_is_kept_and_a_custom_window_s_is_read_each_time(kept, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.utils import timezone

    from console.ranges import Window
    from fleet.telemetry.read import figures as telemetry_figures

    reads = []
    monkeypatch.setattr(telemetry_figures, "site_series", lambda **kw: reads.append(kw) or {"n": len(reads)})
    assert fleet_summary.current_series("24h", None, None) == {"n": 1}
    assert fleet_summary.current_series("24h", None, None) == {"n": 1}  # kept for every reader
    assert fleet_summary.current_series("24h", 7, None) == {"n": 2}  # a site's are its own
    now = timezone.now()
    custom = Window(start=now - timedelta(hours=3), end=now - timedelta(hours=1), preset=None, resolution="1m")
    assert fleet_summary.current_series("24h", None, custom) == {"n": 3}
    assert fleet_summary.current_series("24h", None, custom) == {"n": 4}
    assert reads[-1]["window"] is custom
