"""Counters shared by every process: increments collect in process memory and reach the Redis hash
within a second (a background thread) or at once when this process reads them."""

from __future__ import annotations

import time

import pytest
import redis

from console import counters
from tests.conftest import redis_url


@pytest.fixture
def redis_counters(settings) -> redis.Redis:
    settings.REDIS_URL = redis_url()
    counters.reset()
    yield redis.Redis.from_url(redis_url())
    counters.reset()


def _hincrby_sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """The HINCRBY commands this process sends from now on, alone or in a pipeline. Counted here,
    not from the server's command statistics: parallel workers use the same server meanwhile."""
    sent: list[tuple[object, ...]] = []
    for cls, name in ((redis.Redis, "execute_command"), (redis.client.Pipeline, "pipeline_execute_command")):
        real = getattr(cls, name)

        def counting(self: redis.Redis, *args: object, _real=real, **options: object) -> object:  # type: ignore[no-untyped-def]
            if str(args[0]).upper() == "HINCRBY":
                sent.append(args)
            return _real(self, *args, **options)

        monkeypatch.setattr(cls, name, counting)
    return sent


def test_increments_reach_redis_within_a_second_without_a_round_trip_each(redis_counters, monkeypatch) -> None:
    key_a, key_b = 'goodput_test_total{kind="a"}', 'goodput_test_total{kind="b"}'
    sent = _hincrby_sent(monkeypatch)
    for _ in range(500):
        counters.increment("goodput_test_total", kind="a")
    counters.increment("goodput_test_total", 7, kind="b")
    deadline = time.monotonic() + 3
    while redis_counters.hget(counters.HASH, key_b) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(redis_counters.hget(counters.HASH, key_a)) == 500
    assert int(redis_counters.hget(counters.HASH, key_b)) == 7
    assert 2 <= len(sent) <= 4  # a flush or two, not 501 round trips


def test_a_snapshot_includes_this_process_pending_increments(redis_counters) -> None:
    redis_counters.hset(counters.HASH, 'goodput_test_total{kind="a"}', 10)  # another process's
    counters.increment("goodput_test_total", 2, kind="a")
    assert counters.snapshot()['goodput_test_total{kind="a"}'] == 12


def test_increments_survive_a_redis_outage(redis_counters, settings) -> None:
    counters.increment("goodput_test_total", 3, kind="a")
    counters._client = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    counters.flush()  # fails quietly: counting never fails a request, and nothing is dropped
    counters._client = None
    counters.increment("goodput_test_total", 1, kind="a")
    assert counters.snapshot()['goodput_test_total{kind="a"}'] == 4
