"""A Prometheus push answered 202 is stored, retried, or dead-lettered with its error: never lost.

With a real Celery worker whose database is cut off (a proxy between them), pushes answered 202
wait and are stored exactly once when it comes back, as the JSON path's batches are. A push that
fails on its own data goes to the dead-letter stream, from where it is replayed once fixed.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from fleet.ingest import push_queue
from fleet.ingest.prometheus import packed
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


def run_drain(broker) -> int:  # type: ignore[no-untyped-def]
    """Run the drain the door scheduled (with its slot and token, as the worker would), or the
    beat's drain when none is queued."""
    messages = [json.loads(m) for m in broker.lrange("celery", 0, -1)]
    drains = [m for m in messages if m["headers"]["task"] == "fleet.tasks.drain_prometheus_ingest"]
    broker.delete("celery")
    args = json.loads(base64.b64decode(drains[-1]["body"]))[0] if drains else [None, None]  # oldest last
    return push_queue.drain(*args, consumer="test")


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
    from fleet.ingest.prometheus import parse_exposition

    now = timezone.now()
    options = {"hostname": None, "endpoint": None, "kind": "auto", "now": now.isoformat()}
    key = "424242:k:orphan-push"
    exposition = parse_exposition(DCGM, **options)
    # Site 424242 does not exist: the batch key's foreign key fails, which is the push's own fault.
    push_queue.enqueue(site_id=424242, key=key, payload=packed(exposition), options=options, samples=2, enqueued_at=now)
    run_drain(broker_mode)
    assert broker_mode.xlen(push_queue.DEAD_LETTERS) == 1 and not GpuSample.objects.exists()
    assert broker_mode.xlen(push_queue.STREAM) == 0  # not retried for ever: it left the queue
    out = StringIO()
    call_command("replay_dead_letters", stdout=out)
    assert key in out.getvalue() and "IntegrityError" in out.getvalue() and "Prometheus push" in out.getvalue()

    Site.objects.create(id=424242, name="late-site", region="eu")  # the cause, fixed
    out = StringIO()
    call_command("replay_dead_letters", "--replay", stdout=out)
    assert "1 Prometheus push(es)" in out.getvalue() and broker_mode.xlen(push_queue.DEAD_LETTERS) == 0
    assert broker_mode.xlen(push_queue.STREAM) == 1  # queued again, a drain scheduled: run it as a worker would
    run_drain(broker_mode)
    assert GpuSample.objects.count() == 2 and IngestBatch.objects.filter(key=f"{key}:gpu").exists()


@pytest.mark.django_db
def test_a_task_queued_before_pushes_had_their_stream_moves_its_body_onto_it(broker_mode, site_a) -> None:
    """A deploy leaves old ingest_prometheus_batch tasks in the broker, their bodies stashed: they
    put the body on the push stream, where a drain stores it."""
    from console.queues import STASH_PREFIX, stash_payload

    now = timezone.now().isoformat()
    options = {"hostname": None, "endpoint": None, "kind": "auto", "now": now}
    key = f"{site_a.pk}:k:before-the-stream"
    stash_payload(key, DCGM.encode())  # a text body, as the oldest tasks left it
    assert ingest_prometheus_batch.apply(args=[site_a.pk, key, None, options, now]).get() == 0
    assert broker_mode.get(STASH_PREFIX + key) is None and broker_mode.xlen(push_queue.STREAM) == 1
    assert run_drain(broker_mode) == 2
    assert GpuSample.objects.count() == 2


@pytest.mark.django_db
def test_pushes_waiting_for_a_writer_count_toward_back_pressure(broker_mode, client, token_a, settings):
    from console import queues

    settings.INGEST_QUEUE_BOUND = 2
    for _ in range(2):
        assert push(client, token_a, DCGM).status_code == 202
    queues.reset()
    response = push(client, token_a, DCGM)
    assert response.status_code == 429 and response["Retry-After"]
    # Stored, a push stops counting.
    assert run_drain(broker_mode) == 4
    queues.reset()
    assert push(client, token_a, DCGM).status_code == 202


@pytest.mark.django_db
def test_the_worker_stores_what_the_door_parsed_without_parsing_it_again(
    broker_mode, client, site_a, token_a, monkeypatch
):
    """The door queues its parse (prometheus.packed), not the body: the worker's cost is the
    store alone. A body queued as text (before the mark existed) is still parsed: the test above
    stashes one."""
    from fleet.fabric.models import PortSample
    from fleet.ingest import prometheus
    from fleet.storage.models import DiskSample, MountSample

    node = (FIXTURES / "node-exporter.prom").read_text()
    response = push(client, token_a, node, "?hostname=gpu-node-7")
    assert response.status_code == 202, response.content
    accepted, key = response.json()["node_samples"], response.json()["batch"]
    [(_, fields)] = broker_mode.xrange(push_queue.STREAM)
    assert fields[b"k"].decode() == key
    assert fields[b"d"].startswith(prometheus.PARSED_MARK) and b"node_infiniband" not in fields[b"d"]

    def parse_again(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the worker parsed the push again")

    monkeypatch.setattr(prometheus, "parse_exposition", parse_again)
    stored = run_drain(broker_mode)
    assert broker_mode.xlen(push_queue.DEAD_LETTERS) == 0
    rows = PortSample.objects.count() + MountSample.objects.count() + DiskSample.objects.count()
    assert stored == accepted == rows > 0


@pytest.mark.django_db
def test_a_fold_of_pushes_from_two_sites_stores_each_once_under_its_own_site(
    broker_mode, client, site_a, token_a, site_b, token_b
):
    """Several pushes in one fold: the node series of each site go in together, each push's parts
    under their own keys (a second drain of the same entries stores nothing), each on its site."""
    from fleet.fabric.models import PortSample
    from fleet.inventory.models import Node
    from fleet.telemetry.models import IngestBatch

    node = (FIXTURES / "node-exporter.prom").read_text()
    accepted = 0
    for hostname, token in (("fold-a-1", token_a), ("fold-a-2", token_a), ("fold-b-1", token_b)):
        response = push(client, token, node, f"?hostname={hostname}")
        assert response.status_code == 202, response.content
        accepted += response.json()["node_samples"]
    entries = broker_mode.xrange(push_queue.STREAM)
    assert len(entries) == 3
    assert run_drain(broker_mode) == accepted
    sites = dict(Node.objects.filter(hostname__startswith="fold-").values_list("hostname", "site_id"))
    assert sites == {"fold-a-1": site_a.pk, "fold-a-2": site_a.pk, "fold-b-1": site_b.pk}
    per_host = {
        h: PortSample.objects.filter(interface__node__hostname=h).count() for h in ("fold-a-1", "fold-a-2", "fold-b-1")
    }
    assert len(set(per_host.values())) == 1 and per_host["fold-a-1"] > 0
    # The same three entries again (a writer that died before acknowledging): nothing twice.
    for _, fields in entries:
        broker_mode.xadd(push_queue.STREAM, fields)
    assert run_drain(broker_mode) == 0
    assert sum(PortSample.objects.filter(interface__node__hostname=h).count() for h in per_host) == sum(
        per_host.values()
    )
    assert IngestBatch.objects.filter(key__endswith=":port").count() == 3
