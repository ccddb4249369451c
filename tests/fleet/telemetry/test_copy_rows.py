"""GPU batches of registered GPUs travel from the door to the writer as binary COPY rows
(fleet.telemetry.copyrows): what is stored, the state and the batch record are what the agent
sent, a GPU moved away in between loses its rows, and a short read waits once for a fuller fold.

The drain runs in the test process against the real Redis and PostgreSQL, as in
test_ingest_stream.py; test_production_path.py runs the same path inside the Celery worker.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from django.db import connection

from fleet.ingest import stream as ingest_stream
from fleet.inventory import directory
from fleet.inventory.models import Gpu
from fleet.models import GpuState, IngestBatch
from fleet.telemetry import copyrows
from fleet.telemetry.fields import GpuSampleIn
from tests.conftest import make_sample, post_batch
from tests.fleet.telemetry.test_ingest_stream import _run_drain

pytestmark = pytest.mark.django_db(transaction=True)


def _post(client, token: str, samples: list[dict], key: str) -> None:  # type: ignore[no-untyped-def]
    response = post_batch(client, token, {"samples": samples}, **{"Idempotency-Key": key})
    assert response.status_code == 202, response.content


def _entries(broker) -> list[dict]:  # type: ignore[no-untyped-def]
    return [fields for _, fields in broker.xrange(ingest_stream.STREAM)]


def _stored(uuid: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.ts, s.gpu_util, s.power_w, s.energy_mj, s.xid, s.memory_temp_c FROM fleet_gpusample s "
            "JOIN fleet_gpu g ON g.id = s.gpu_id WHERE g.uuid = %s ORDER BY s.ts",
            [uuid],
        )
        return cursor.fetchall()


def test_a_batch_of_registered_gpus_is_queued_as_rows_and_stored_as_sent(client, token_a, broker_mode) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    uuids = [f"GPU-rows-{i}" for i in range(3)]
    # First sight: the GPUs are not registered, so the batch goes as samples and registers them.
    _post(
        client, token_a, [make_sample(gpu_uuid=u, ts=(now - timedelta(seconds=30)).isoformat()) for u in uuids], "one"
    )
    [first] = _entries(broker_mode)
    assert b"d" in first and b"r" not in first
    assert _run_drain(broker_mode) == 3

    # Now they are: two samples each, out of order, one without memory_temp_c (stored NULL).
    samples = []
    for i, uuid in enumerate(uuids):
        for seconds, util in ((2, 71.3), (1, 12.5)):
            samples.append(
                make_sample(
                    gpu_uuid=uuid, ts=(now - timedelta(seconds=seconds)).isoformat(), gpu_util=util + i, power_w=612.3
                )
            )
    samples[0].pop("memory_temp_c")
    _post(client, token_a, samples, "two")
    [second] = _entries(broker_mode)
    assert b"r" in second and b"d" not in second
    assert _run_drain(broker_mode) == 6

    assert IngestBatch.objects.get(key__endswith=":two").samples == 6
    stored = _stored(uuids[0])
    assert [row[0] for row in stored] == [now - timedelta(seconds=s) for s in (30, 2, 1)]
    assert stored[1][1:] == (pytest.approx(71.3), pytest.approx(612.3), 918273645512, 0, None)
    for i, uuid in enumerate(uuids):
        state = GpuState.objects.get(gpu__uuid=uuid)
        # The newest sample (one second ago), not the last one sent; reals come back as sent.
        assert state.ts == now - timedelta(seconds=1)
        assert state.gpu_util == 12.5 + i
        assert state.power_w == 612.3
        assert state.energy_mj == 918273645512


def test_a_gpu_moved_to_another_site_after_the_door_loses_its_rows(client, token_a, site_b, broker_mode) -> None:
    uuids = ["GPU-moving", "GPU-staying"]
    _post(client, token_a, [make_sample(gpu_uuid=u, hostname=f"host-{u.lower()}") for u in uuids], "first")
    _run_drain(broker_mode)
    _post(client, token_a, [make_sample(gpu_uuid=u, hostname=f"host-{u.lower()}") for u in uuids], "second")
    assert b"r" in _entries(broker_mode)[0]
    # Moved between the door's check and the write (the door's directory still had it here).
    moved = Gpu.objects.select_related("node").get(uuid="GPU-moving")
    moved.node.site = site_b
    moved.node.save()
    directory.clear()

    assert _run_drain(broker_mode) == 1
    assert len(_stored("GPU-moving")) == 1 and len(_stored("GPU-staying")) == 2


def test_rows_whose_index_does_not_match_go_to_the_dead_letters(client, token_a, site_a, broker_mode) -> None:
    _post(client, token_a, [make_sample(gpu_uuid="GPU-indexed")], "first")
    _run_drain(broker_mode)
    _post(client, token_a, [make_sample(gpu_uuid="GPU-indexed")], "second")
    [(entry_id, fields)] = broker_mode.xrange(ingest_stream.STREAM)
    broker_mode.xdel(ingest_stream.STREAM, entry_id)
    broker_mode.xadd(ingest_stream.STREAM, {**fields, b"r": fields[b"r"][:-3]})  # a row cut short

    assert _run_drain(broker_mode) == 0
    [(_, dead)] = broker_mode.xrange(ingest_stream.DEAD_LETTERS)
    assert b"does not describe" in dead[b"error"]


def test_a_short_read_waits_once_for_more_batches_before_writing(client, token_a, broker_mode, settings, monkeypatch):  # type: ignore[no-untyped-def]
    settings.INGEST_FOLD_WAIT_MS = 40
    _post(client, token_a, [make_sample(gpu_uuid="GPU-wait-1")], "early")
    waits = []

    def meanwhile(seconds: float) -> None:  # another batch arrives while the drain waits
        waits.append(seconds)
        if len(waits) == 1:
            _post(client, token_a, [make_sample(gpu_uuid="GPU-wait-2")], "late")

    monkeypatch.setattr(ingest_stream.time, "sleep", meanwhile)
    assert _run_drain(broker_mode) == 2
    assert waits[0] == 0.04
    # Both in one transaction: received_at is the transaction's now().
    assert IngestBatch.objects.values("received_at").distinct().count() == 1

    settings.INGEST_FOLD_WAIT_MS = 0
    waits.clear()
    _post(client, token_a, [make_sample(gpu_uuid="GPU-wait-3")], "alone")
    assert _run_drain(broker_mode) == 1
    assert waits == []


def _rows(gpu_ids: list[int], seconds: list[int], util: float = 50.0) -> copyrows.SampleRows:
    start = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)
    samples = [
        msgspec.convert({**make_sample(gpu_util=util + s), "ts": start + timedelta(seconds=s)}, GpuSampleIn)
        for s in seconds
    ]
    return copyrows.format_samples(gpu_ids, samples)


def test_the_newest_row_of_each_gpu_is_picked_across_batches_in_id_order() -> None:
    first = _rows([7, 3, 7], [5, 9, 1])
    second = _rows([3, 7], [9, 2])  # GPU 3: the same time as in the first batch, so this later one wins
    picked = copyrows.newest_rows([first, second])
    assert picked == [second.data[: second.index.ends[0]], first.data[: first.index.ends[0]]]


def test_without_drops_the_rows_of_those_gpus_and_keeps_the_index_true() -> None:
    rows = _rows([1, 2, 1, 3], [1, 2, 3, 4])
    kept = copyrows.without(rows, {1})
    assert kept.index.gpu_ids == [2, 3]
    assert kept.index.stamps == [rows.index.stamps[1], rows.index.stamps[3]]
    assert kept.data == rows.data[rows.index.ends[0] : rows.index.ends[1]] + rows.data[rows.index.ends[2] :]
    assert kept.index.ends[-1] == len(kept.data)
    assert copyrows.decode(kept.data, copyrows.encode_index(kept.index)) == kept
