"""The ingest stream between the API and the writers: batches queue in Redis, a drain folds them
into transactions, and nothing is lost or written twice when a writer dies or a batch is bad.

These run the drain in the test process against the real Redis and PostgreSQL; the worker
process tests (test_worker_crash.py, test_production_path.py) run it inside Celery.
"""

from __future__ import annotations

import base64
import json
import time
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.test import Client

from fleet.ingest import stream as ingest_stream
from fleet.models import GpuSample, IngestBatch, Site
from tests.conftest import make_sample, post_batch

pytestmark = pytest.mark.django_db(transaction=True)


def _queue(client: Client, token: str, count: int, *, per_batch: int = 3, key: str = "b") -> list[str]:
    """POST ``count`` batches through the API; return their batch keys."""
    keys = []
    for n in range(count):
        samples = [make_sample(hostname=f"{key}-node", gpu_uuid=f"GPU-{key}-{n:03d}-{i:03d}") for i in range(per_batch)]
        response = post_batch(client, token, {"samples": samples}, **{"Idempotency-Key": f"{key}-{n}"})
        assert response.status_code == 202, response.content
        keys.append(response.json()["batch"])
    return keys


def _received_at(keys: list[str]) -> set:
    return set(IngestBatch.objects.filter(key__in=keys).values_list("received_at", flat=True))


def _drain_messages(broker) -> list[dict]:
    messages = [json.loads(m) for m in broker.lrange("celery", 0, -1)]
    return [m for m in messages if m["headers"]["task"] == "fleet.tasks.drain_gpu_ingest"]


def _task_args(message: dict) -> list:
    return json.loads(base64.b64decode(message["body"]))[0]


def _run_drain(broker, consumer: str = "test") -> int:
    """Run the oldest drain task queued (as the worker would: with its slot and token), or the
    beat's drain when none is queued."""
    messages = _drain_messages(broker)
    broker.delete("celery")
    args = _task_args(messages[-1]) if messages else [None, None]  # kombu LPUSHes: oldest last
    return ingest_stream.drain(*args, consumer=consumer)


def test_queued_batches_are_folded_into_one_transaction(client, token_a, broker_mode, settings) -> None:
    keys = _queue(client, token_a, 5)
    assert broker_mode.xlen(ingest_stream.STREAM) == 5 and GpuSample.objects.count() == 0
    assert broker_mode.llen("celery") == 1  # one drain scheduled for the five batches, not five tasks

    assert _run_drain(broker_mode) == 15
    assert GpuSample.objects.count() == 15
    # received_at is the transaction's now(): one value means one transaction.
    assert len(_received_at(keys)) == 1
    assert broker_mode.xlen(ingest_stream.STREAM) == 0  # acknowledged and deleted once committed
    assert not broker_mode.exists(ingest_stream.slot_keys()[0])  # the drainer slot is free again


def test_folds_are_cut_at_the_batch_and_sample_limits(client, token_a, broker_mode, settings) -> None:
    settings.INGEST_FOLD_BATCHES = 2
    keys = _queue(client, token_a, 5)
    assert _run_drain(broker_mode) == 15
    assert len(_received_at(keys)) == 3  # 2 + 2 + 1

    settings.INGEST_FOLD_BATCHES = 10
    settings.INGEST_FOLD_SAMPLES = 7
    keys = _queue(client, token_a, 5, key="c")
    assert _run_drain(broker_mode) == 15
    assert len(_received_at(keys)) == 3  # 6 samples, 6, then 3: never more than 7 in a fold


def test_a_redelivered_batch_in_a_fold_is_skipped_and_the_rest_is_written(client, token_a, site_a, broker_mode) -> None:
    first = _queue(client, token_a, 1, key="again")[0]
    _run_drain(broker_mode)
    # The agent retries the same batch (same Idempotency-Key) and sends a new one.
    _queue(client, token_a, 1, key="again")
    _queue(client, token_a, 1, key="new")
    assert _run_drain(broker_mode) == 3  # only the new batch's samples
    assert GpuSample.objects.count() == 6
    assert IngestBatch.objects.filter(key=first).count() == 1


def test_a_bad_batch_goes_to_dead_letters_and_does_not_hold_back_its_fold(client, token_a, site_a, broker_mode) -> None:
    good = _queue(client, token_a, 2, key="good")
    # One undecodable entry, and one that fails in the database (a site that does not exist).
    broker_mode.xadd(ingest_stream.STREAM, {"k": "1:k:garbled", "s": site_a.id, "n": 1, "e": "x", "d": b"\xc1"})
    [(_, fields)] = broker_mode.xrange(ingest_stream.STREAM, count=1)
    broker_mode.xadd(ingest_stream.STREAM, {**fields, b"k": b"999999:k:orphan", b"s": b"999999"})
    more = _queue(client, token_a, 1, key="more")

    stored = _run_drain(broker_mode)
    assert set(IngestBatch.objects.values_list("key", flat=True)) == {*good, *more}
    assert stored == 9
    assert broker_mode.xlen(ingest_stream.STREAM) == 0
    dead = {fields[b"k"]: fields[b"error"].decode() for _, fields in broker_mode.xrange(ingest_stream.DEAD_LETTERS)}
    assert set(dead) == {b"1:k:garbled", b"999999:k:orphan"}
    assert "IntegrityError" in dead[b"999999:k:orphan"]


def test_batches_a_dead_writer_left_pending_are_taken_over(client, token_a, broker_mode, settings) -> None:
    settings.INGEST_RECLAIM_SECONDS = 1
    keys = _queue(client, token_a, 3)
    # A writer reads the batches and dies before committing: they stay pending, with it.
    ingest_stream.ensure_group(broker_mode)
    broker_mode.xreadgroup(ingest_stream.GROUP, "dead-writer", {ingest_stream.STREAM: ">"}, count=10)

    assert _run_drain(broker_mode, "alive") == 0  # too recent to take over
    check = [json.loads(m) for m in broker_mode.lrange("celery", 0, -1)]
    assert any(m["headers"]["task"] == "fleet.tasks.drain_gpu_ingest" and m["headers"]["eta"] for m in check)

    time.sleep(1.1)
    assert _run_drain(broker_mode, "alive") == 9
    assert IngestBatch.objects.filter(key__in=keys).count() == 3
    assert broker_mode.xpending(ingest_stream.STREAM, ingest_stream.GROUP)["pending"] == 0


def test_a_writer_takes_back_its_own_pending_batches_first(client, token_a, broker_mode) -> None:
    _queue(client, token_a, 2)
    ingest_stream.ensure_group(broker_mode)
    broker_mode.xreadgroup(ingest_stream.GROUP, "restarted", {ingest_stream.STREAM: ">"}, count=10)
    # The same process (consumer) runs its next drain: no need to wait for the reclaim time.
    assert _run_drain(broker_mode, "restarted") == 6


def test_the_periodic_drain_forgets_writers_that_are_gone(client, token_a, broker_mode, monkeypatch) -> None:
    _queue(client, token_a, 2)
    ingest_stream.ensure_group(broker_mode)
    broker_mode.xreadgroup(ingest_stream.GROUP, "holds-one", {ingest_stream.STREAM: ">"}, count=1)
    [[_, [(entry_id, _)]]] = broker_mode.xreadgroup(
        ingest_stream.GROUP, "holds-none", {ingest_stream.STREAM: ">"}, count=1
    )
    broker_mode.xack(ingest_stream.STREAM, ingest_stream.GROUP, entry_id)
    names = {c["name"] for c in broker_mode.xinfo_consumers(ingest_stream.STREAM, ingest_stream.GROUP)}
    assert {b"holds-one", b"holds-none"} <= names
    monkeypatch.setattr(ingest_stream, "CONSUMER_IDLE_MS", 0)
    broker_mode.delete("celery", *ingest_stream.slot_keys())  # the API's drain has come and gone
    time.sleep(0.01)
    ingest_stream.drain(None, None, consumer="beat")
    names = {c["name"] for c in broker_mode.xinfo_consumers(ingest_stream.STREAM, ingest_stream.GROUP)}
    assert b"holds-one" in names  # it still holds a batch: it may come back for it
    assert b"holds-none" not in names


def test_two_copies_of_a_batch_in_one_fold_are_written_once(client, token_a, broker_mode) -> None:
    """An agent's retry (same Idempotency-Key) queued before the first copy was written."""
    _queue(client, token_a, 1, key="twice")
    _queue(client, token_a, 1, key="twice")
    assert broker_mode.xlen(ingest_stream.STREAM) == 2
    assert _run_drain(broker_mode) == 3
    assert GpuSample.objects.count() == 3
    assert broker_mode.xlen(ingest_stream.STREAM) == 0


def test_an_outage_leaves_the_batches_pending_and_retries_later(client, token_a, broker_mode, monkeypatch) -> None:
    _queue(client, token_a, 3)
    [message] = _drain_messages(broker_mode)
    slot, token = _task_args(message)
    broker_mode.delete("celery")

    def connection_lost(batches):
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(ingest_stream, "store_gpu_batches", connection_lost)
    assert ingest_stream.drain(slot, token, consumer="test") == 0
    assert broker_mode.xpending(ingest_stream.STREAM, ingest_stream.GROUP)["pending"] == 3  # not lost
    assert broker_mode.xlen(ingest_stream.DEAD_LETTERS) == 0  # and not blamed on the batches
    [retry] = _drain_messages(broker_mode)
    assert retry["headers"]["eta"]  # later, by the same drainer, which keeps its slot
    assert _task_args(retry) == [slot, token]
    assert broker_mode.get(ingest_stream.slot_keys()[slot]).decode() == token

    monkeypatch.undo()
    assert ingest_stream.drain(slot, token, consumer="test") == 9  # the database is back
    assert not broker_mode.exists(ingest_stream.slot_keys()[slot])


def test_when_every_batch_of_a_fold_fails_they_stay_pending(client, token_a, broker_mode, monkeypatch) -> None:
    """Not one bad batch but a bug or a mismatch: nothing is dead-lettered."""
    _queue(client, token_a, 3)

    def broken(batches):
        raise ValueError("a bug in the writer")

    monkeypatch.setattr(ingest_stream, "store_gpu_batches", broken)
    with pytest.raises(ValueError, match="a bug in the writer"):
        _run_drain(broker_mode)
    assert broker_mode.xlen(ingest_stream.DEAD_LETTERS) == 0
    assert broker_mode.xpending(ingest_stream.STREAM, ingest_stream.GROUP)["pending"] == 3
    monkeypatch.undo()
    assert _run_drain(broker_mode) == 9  # the same writer takes them back once fixed


def test_dead_letters_can_be_listed_and_replayed_once_fixed(client, token_a, site_a, broker_mode) -> None:
    _queue(client, token_a, 1, key="first")
    _queue(client, token_a, 1, key="orphan")  # its own GPUs: another site's would be held back by the writer
    [_, (entry, fields)] = broker_mode.xrange(ingest_stream.STREAM, count=2)
    broker_mode.xdel(ingest_stream.STREAM, entry)
    broker_mode.xadd(ingest_stream.STREAM, {**fields, b"k": b"424242:k:orphan", b"s": b"424242"})
    assert _run_drain(broker_mode) == 3
    out = StringIO()
    call_command("replay_dead_letters", stdout=out)
    assert "424242:k:orphan" in out.getvalue() and "IntegrityError" in out.getvalue()

    Site.objects.create(id=424242, name="late-site", region="eu")  # the cause, fixed
    out = StringIO()
    call_command("replay_dead_letters", "--replay", stdout=out)
    assert "Put 1 GPU batch(es) back" in out.getvalue()
    assert _run_drain(broker_mode) == 3
    assert IngestBatch.objects.filter(key="424242:k:orphan").exists()
    assert broker_mode.xlen(ingest_stream.DEAD_LETTERS) == 0


def test_a_drain_never_frees_a_slot_it_no_longer_owns(client, token_a, broker_mode) -> None:
    _queue(client, token_a, 1)
    slot_key = ingest_stream.slot_keys()[0]
    broker_mode.set(slot_key, "another-drainer")  # ours expired and another drain took it
    assert ingest_stream.drain(0, "ours", consumer="test") == 3
    assert broker_mode.get(slot_key) == b"another-drainer"


def test_a_drain_hands_over_to_a_fresh_task_when_its_time_is_up(client, token_a, broker_mode, settings) -> None:
    settings.INGEST_FOLD_BATCHES = 1
    settings.INGEST_DRAIN_SECONDS = 0
    _queue(client, token_a, 3)
    [message] = _drain_messages(broker_mode)
    slot, token = _task_args(message)
    broker_mode.delete("celery")
    assert ingest_stream.drain(slot, token, consumer="test") == 3  # one fold, then time is up
    [handover] = _drain_messages(broker_mode)
    assert _task_args(handover) == [slot, token]
    assert broker_mode.get(ingest_stream.slot_keys()[slot]).decode() == token  # still held for it
    assert broker_mode.xlen(ingest_stream.STREAM) == 2
