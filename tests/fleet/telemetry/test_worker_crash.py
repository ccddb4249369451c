"""A worker killed with SIGKILL in the middle of a batch loses nothing and duplicates nothing.

The batches' transaction never commits, so nothing of it is written; the batches stay pending in
the ingest stream's consumer group, and a later drain takes them over once they have been idle
for GOODPUT_INGEST_RECLAIM_SECONDS; the batch keys make a second write of a committed batch a
no-op.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from django.db import connection
from django.test import Client

from fleet.models import GpuSample, IngestBatch
from tests.conftest import make_sample, post_batch, redis_url
from tests.stack import Stack

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

BATCHES, PER_BATCH = 4, 10_000


def _post_batches(token: str) -> None:
    client = Client()
    for b in range(BATCHES):
        samples = [
            make_sample(hostname=f"crash-{b}", gpu_index=i % 8, gpu_uuid=f"GPU-crash-{b}-{i:05d}")
            for i in range(PER_BATCH)
        ]
        assert post_batch(client, token, {"samples": samples}).status_code == 202


def _wait_for_copy(timeout: float = 30) -> None:
    """Block until a worker is inside a COPY of GPU samples (the middle of a batch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'COPY fleet_gpusample%%'"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.002)
    pytest.fail("no worker was seen copying a batch")


def _wait_for_log(path: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"{path.name} never said {text!r}:\n{path.read_text()[-2000:]}")


def _wait_for_all_batches(timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if IngestBatch.objects.count() == BATCHES:
            return
        time.sleep(0.2)
    pytest.fail(f"only {IngestBatch.objects.count()} of {BATCHES} batches were stored")


def _assert_exactly_once() -> None:
    assert IngestBatch.objects.count() == BATCHES
    assert GpuSample.objects.count() == BATCHES * PER_BATCH
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT gpu_id, ts FROM fleet_gpusample GROUP BY 1, 2 HAVING count(*) > 1) d"
        )
        assert cursor.fetchone()[0] == 0


def test_killing_the_pool_process_mid_batch_loses_and_duplicates_nothing(tmp_path: Path, token_a) -> None:
    stack = Stack(redis_url(), tmp_path, GOODPUT_INGEST_RECLAIM_SECONDS="2")
    stack.flush_redis()
    worker = stack.start_worker(pool="prefork")
    try:
        _post_batches(token_a)
        _wait_for_copy()
        [child] = psutil.Process(worker.pid).children()
        os.kill(child.pid, signal.SIGKILL)  # the process running the batch dies mid-COPY
        _wait_for_all_batches()
        _assert_exactly_once()
        log = (tmp_path / "worker.log").read_text()
        assert "WorkerLostError" in log
        assert "took over" in log  # the pending batches were taken over, not written by luck
    finally:
        stack.stop()


def test_killing_the_whole_worker_mid_batch_loses_and_duplicates_nothing(tmp_path: Path, token_a) -> None:
    stack = Stack(redis_url(), tmp_path, GOODPUT_TASK_VISIBILITY_TIMEOUT="2", GOODPUT_INGEST_RECLAIM_SECONDS="2")
    stack.flush_redis()
    first = stack.start_worker(pool="solo", name="first")
    try:
        _post_batches(token_a)
        _wait_for_copy()
        first.send_signal(signal.SIGKILL)  # the whole worker is gone; its batches are pending
        first.wait(timeout=10)
        time.sleep(2.5)  # past the visibility timeout and the reclaim time
        stack.start_worker(pool="solo", name="second")
        _wait_for_all_batches()
        _assert_exactly_once()
        # The dead worker's batches are taken over: a batch it had committed before the kill is
        # stored already, so its takeover (a re-read the batch key makes harmless) may come after.
        _wait_for_log(tmp_path / "second.log", "took over")
        _assert_exactly_once()
    finally:
        stack.stop()
