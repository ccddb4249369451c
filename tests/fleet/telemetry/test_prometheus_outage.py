"""A Prometheus push answered 202 is stored, retried, or dead-lettered with its error: never lost.

With a real Celery worker whose database is cut off (a proxy between them), pushes answered 202
wait and are stored exactly once when it comes back, as the JSON path's batches are. A push that
fails on its own data goes to the dead-letter stream, from where it is replayed once fixed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from fleet.ingest import push_queue
from fleet.models import GpuSample, IngestBatch, ServingSample, Site
from fleet.tasks import ingest_prometheus_batch
from tests.conftest import redis_url
from tests.fleet.telemetry.test_prometheus_ingest import DCGM, FIXTURES, VLLM, push
from tests.stack import Stack, TcpProxy, database_address, proxied_database_url


@pytest.fixture
def cut_off_worker(tmp_path: Path) -> Iterator[tuple[Stack, TcpProxy]]:
    proxy = TcpProxy(*database_address())
    # A short pool timeout: each attempt during the outage gives up in 2 s, not the default 10.
    stack = Stack(redis_url(), tmp_path, DATABASE_URL=proxied_database_url(proxy), DATABASE_POOL_TIMEOUT="2")
    stack.flush_redis()
    stack.start_worker()
    yield stack, proxy
    stack.stop()
    proxy.close()


def wait_for(check, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.25)
    return check()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_pushes_accepted_while_the_workers_database_is_down_are_stored_once_it_is_back(cut_off_worker, token_a) -> None:
    stack, proxy = cut_off_worker
    proxy.cut()
    client = Client()
    for _ in range(4):  # four observations of the same exposition (no key: each is new)
        assert push(client, token_a, DCGM).status_code == 202
    assert push(client, token_a, VLLM, **{"Idempotency-Key": "vllm-1"}).status_code == 202
    assert push(client, token_a, VLLM, **{"Idempotency-Key": "vllm-1"}).status_code == 202  # a retry

    log = stack.log_dir / "worker.log"
    assert wait_for(lambda: log.read_text().count("retrying") >= 4, 60), log.read_text()[-3000:]
    assert GpuSample.objects.count() == 0 and ServingSample.objects.count() == 0

    proxy.restore()
    assert wait_for(lambda: GpuSample.objects.count() >= 8 and ServingSample.objects.count() >= 76, 120), (
        GpuSample.objects.count(),
        ServingSample.objects.count(),
        log.read_text()[-3000:],
    )
    time.sleep(2)  # anything still queued would land now
    assert GpuSample.objects.count() == 8 and ServingSample.objects.count() == 76
    assert stack.procs[0].poll() is None  # the worker rode the outage out


@pytest.mark.django_db(transaction=True)  # the foreign key is checked at a real commit
def test_a_push_that_fails_on_its_own_data_is_dead_lettered_then_replayed(broker_mode, client, token_a) -> None:
    now = timezone.now().isoformat()
    options = {"hostname": None, "endpoint": None, "kind": "auto", "now": now}
    key = "424242:k:orphan-push"
    from console.queues import stash_payload

    stash_payload(key, DCGM.encode())
    # Site 424242 does not exist: the batch key's foreign key fails, which is the push's own fault.
    ingest_prometheus_batch.apply(args=[424242, key, None, options, now])
    assert broker_mode.xlen(push_queue.DEAD_LETTERS) == 1 and not GpuSample.objects.exists()
    out = StringIO()
    call_command("replay_dead_letters", stdout=out)
    assert key in out.getvalue() and "IntegrityError" in out.getvalue()

    Site.objects.create(id=424242, name="late-site", region="eu")  # the cause, fixed
    out = StringIO()
    call_command("replay_dead_letters", "--replay", stdout=out)
    assert "1 Prometheus push(es)" in out.getvalue() and broker_mode.xlen(push_queue.DEAD_LETTERS) == 0
    assert broker_mode.llen("celery") == 1  # queued again, body stashed again: run it as a worker would
    ingest_prometheus_batch.apply(args=[424242, key, None, options, now])
    assert GpuSample.objects.count() == 2 and IngestBatch.objects.filter(key=f"{key}:gpu").exists()


@pytest.mark.django_db
def test_pushes_waiting_in_a_retrying_worker_still_count_toward_back_pressure(broker_mode, client, token_a, settings):
    from console import queues

    settings.INGEST_QUEUE_BOUND = 2
    for _ in range(2):
        assert push(client, token_a, DCGM).status_code == 202
    broker_mode.delete("celery")  # a worker took the tasks and is retrying them through an outage
    queues.reset()
    response = push(client, token_a, DCGM)
    assert response.status_code == 429 and response["Retry-After"]
    # Stored or dead-lettered, a push stops counting.
    [key, _] = broker_mode.zrange(push_queue.PENDING, 0, -1)
    push_queue.done(key.decode())
    queues.reset()
    assert push(client, token_a, DCGM).status_code == 202


@pytest.mark.django_db
def test_the_worker_stores_what_the_door_parsed_without_parsing_it_again(
    broker_mode, client, site_a, token_a, monkeypatch
):
    """The door queues its parse (prometheus.packed), not the body: the worker's cost is the
    store alone. A body queued as text (before the mark existed) is still parsed: the replay test
    above stashes one."""
    from console.queues import STASH_PREFIX
    from fleet.fabric.models import PortSample
    from fleet.ingest import prometheus
    from fleet.storage.models import DiskSample, MountSample

    node = (FIXTURES / "node-exporter.prom").read_text()
    response = push(client, token_a, node, "?hostname=gpu-node-7")
    assert response.status_code == 202, response.content
    accepted, key = response.json()["node_samples"], response.json()["batch"]
    payload = broker_mode.get(STASH_PREFIX + key)
    assert payload.startswith(prometheus.PARSED_MARK) and b"node_infiniband" not in payload

    def parse_again(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the worker parsed the push again")

    monkeypatch.setattr(prometheus, "parse_exposition", parse_again)
    now = timezone.now().isoformat()
    options = {"hostname": "gpu-node-7", "endpoint": None, "kind": "auto", "now": now, "openmetrics": False}
    stored = ingest_prometheus_batch.apply(args=[site_a.pk, key, None, options, now]).get()
    assert broker_mode.xlen(push_queue.DEAD_LETTERS) == 0
    rows = PortSample.objects.count() + MountSample.objects.count() + DiskSample.objects.count()
    assert stored == accepted == rows > 0
