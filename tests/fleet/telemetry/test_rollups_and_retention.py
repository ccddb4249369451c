"""Rollups kept current from dirty buckets; dashboards pick them by range; retention drops partitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from django.db import connection

from fleet.ingest.batches import GpuSampleIn
from fleet.models import (
    GpuRollup1h,
    GpuRollup1m,
    GpuSample,
    GroupRollup1h,
    GroupRollup1m,
    Node,
    PartitionDrop,
    Rack,
    RollupDirty,
    Site,
)
from fleet.telemetry import partitions
from fleet.telemetry.read import figures
from fleet.telemetry.rollups import rollup_lag_seconds, update_rollups
from fleet.telemetry.store import store_gpu_samples
from tests.conftest import make_sample

NOW = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=3)


def sample(**kw) -> GpuSampleIn:  # type: ignore[no-untyped-def]
    values = make_sample(**kw)
    values["ts"] = values["ts"] if isinstance(values["ts"], datetime) else datetime.fromisoformat(values["ts"])
    return msgspec.convert(values, GpuSampleIn, from_attributes=False, strict=False)


def store(site: Site, key: str, *samples: GpuSampleIn) -> int:
    return store_gpu_samples(site_id=site.id, batch_key=key, samples=list(samples))


@pytest.fixture
def two_sites(site_a: Site, site_b: Site) -> tuple[Site, Site]:
    rack = Rack.objects.create(site=site_a, name="r01")
    Node.objects.create(site=site_a, rack=rack, hostname="a-1")
    Node.objects.create(site=site_a, rack=rack, hostname="a-2")
    Node.objects.create(site=site_b, hostname="b-1")
    return site_a, site_b


A0, A1, B0 = "GPU-aaaaaaaa-0000", "GPU-aaaaaaaa-0001", "GPU-bbbbbbbb-0000"


def test_minutes_roll_up_per_gpu_and_per_node_rack_site_and_fleet(two_sites) -> None:
    site_a, site_b = two_sites
    t = NOW
    store(
        site_a,
        "a",
        sample(gpu_uuid=A0, hostname="a-1", ts=t, gpu_util=90, power_w=600, gpu_temp_c=70),
        sample(gpu_uuid=A0, hostname="a-1", ts=t + timedelta(seconds=30), gpu_util=100, power_w=700, gpu_temp_c=80),
        sample(gpu_uuid=A1, hostname="a-2", ts=t + timedelta(seconds=15), gpu_util=50, power_w=300, xid=79),
    )
    store(
        site_b,
        "b",
        sample(
            gpu_uuid=B0, hostname="b-1", ts=t + timedelta(seconds=5), gpu_util=10, power_w=100, throttle_reasons=0x40
        ),
    )
    assert RollupDirty.objects.filter(resolution="1m").count() == 1
    assert update_rollups()["minutes"] == 1
    assert not RollupDirty.objects.filter(resolution="1m").exists()

    a0 = GpuRollup1m.objects.get(gpu__uuid=A0, bucket=t)
    assert (a0.samples, a0.util_mean, a0.util_max, a0.temp_max) == (2, 95, 100, 80)
    assert a0.power_mean == 650 and a0.energy_j == pytest.approx(650 * 60)
    assert GpuRollup1m.objects.get(gpu__uuid=A1).error_samples == 1
    assert GpuRollup1m.objects.get(gpu__uuid=B0).throttled_samples == 1

    def group(scope: str, scope_id: int) -> GroupRollup1m:
        return GroupRollup1m.objects.get(scope=scope, scope_id=scope_id, bucket=t)

    site_row = group("site", site_a.id)
    assert (site_row.gpus, site_row.power_sum, site_row.util_mean, site_row.error_gpus) == (2, 950, 72.5, 1)
    assert group("rack", Rack.objects.get().id).gpus == 2
    assert group("node", Node.objects.get(hostname="a-1").id).power_sum == 650
    fleet = group("fleet", 0)
    assert (fleet.gpus, fleet.power_sum, fleet.throttled_gpus) == (3, 1050, 1)
    assert not GroupRollup1m.objects.filter(scope="rack", scope_id__isnull=True).exists()


def test_late_samples_re_roll_their_minute(two_sites) -> None:
    site_a, _ = two_sites
    store(site_a, "1", sample(gpu_uuid=A0, hostname="a-1", ts=NOW, power_w=100))
    update_rollups()
    # An agent drains its spool: a sample for the same, already rolled, minute arrives late.
    store(site_a, "2", sample(gpu_uuid=A0, hostname="a-1", ts=NOW + timedelta(seconds=40), power_w=300))
    assert rollup_lag_seconds(now=NOW + timedelta(minutes=5)) > 0
    update_rollups()
    rolled = GpuRollup1m.objects.get(gpu__uuid=A0, bucket=NOW)
    assert (rolled.samples, rolled.power_mean) == (2, 200)


def test_hours_roll_up_from_minutes_once_they_settle(two_sites) -> None:
    site_a, _ = two_sites
    hour = NOW.replace(minute=0)
    store(
        site_a,
        "1",
        sample(gpu_uuid=A0, hostname="a-1", ts=hour, gpu_util=20, power_w=100),
        sample(gpu_uuid=A0, hostname="a-1", ts=hour + timedelta(seconds=20), gpu_util=40, power_w=100),
    )
    store(site_a, "2", sample(gpu_uuid=A0, hostname="a-1", ts=hour + timedelta(minutes=1), gpu_util=90, power_w=400))
    update_rollups(now=hour)  # the hour was dirtied just now: not settled, not rolled yet
    assert not GpuRollup1h.objects.exists()
    update_rollups(now=datetime.now(UTC) + timedelta(minutes=2))
    rolled = GpuRollup1h.objects.get(gpu__uuid=A0, bucket=hour)
    assert rolled.samples == 3
    assert rolled.util_mean == pytest.approx((20 + 40 + 90) / 3)  # weighted by samples, not by minutes
    assert rolled.energy_j == pytest.approx(100 * 60 + 400 * 60)
    assert GroupRollup1h.objects.get(scope="site", scope_id=site_a.id, bucket=hour).power_sum == pytest.approx(200)


def test_the_overview_reads_rollups_beyond_fifteen_minutes(two_sites, viewer_client) -> None:
    site_a, _ = two_sites
    for minute in range(3):
        t = NOW - timedelta(minutes=minute)
        store(site_a, f"m{minute}", sample(gpu_uuid=A0, hostname="a-1", ts=t, power_w=500 + minute))
    update_rollups()
    body = viewer_client.get("/api/v1/fleet/overview/", {"range": "1h"}).json()
    series = body["series"]
    assert series["resolution"] == "1m" and series["bucket_seconds"] == 60
    assert series["sites"][str(site_a.id)]["power_kw"] == [0.5, 0.5, 0.5]
    assert figures.RESOLUTION["7d"] == "1h" and figures.RESOLUTION["15m"] == "raw"
    assert all(
        seconds // figures.BUCKET_SECONDS.get(figures.RESOLUTION[k], 10) <= 2000
        for k, seconds in figures.RANGES.items()
    )


def test_samples_are_written_to_daily_partitions(two_sites) -> None:
    site_a, _ = two_sites
    yesterday = NOW - timedelta(days=1)
    store(site_a, "1", sample(gpu_uuid=A0, hostname="a-1", ts=yesterday), sample(gpu_uuid=A0, hostname="a-1", ts=NOW))
    names = partitions.existing_partitions(partitions.SAMPLES)
    assert partitions.SAMPLES.partition_name(partitions.SAMPLES.start_of(yesterday)) in names
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {partitions.SAMPLES.partition_name(partitions.SAMPLES.start_of(NOW))}")
        assert cursor.fetchone()[0] == 1


def test_expired_partitions_are_dropped_whole_and_recorded(two_sites, settings) -> None:
    site_a, _ = two_sites
    settings.RAW_RETENTION_DAYS = 7
    old = NOW - timedelta(days=10)
    store(site_a, "old", *[sample(gpu_uuid=A0, hostname="a-1", ts=old + timedelta(seconds=i)) for i in range(5)])
    store(site_a, "new", sample(gpu_uuid=A0, hostname="a-1", ts=NOW))
    old_partition = partitions.SAMPLES.partition_name(partitions.SAMPLES.start_of(old))
    dropped = partitions.drop_expired_partitions()
    assert {"partition": old_partition, "rows": 5} in dropped
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [old_partition])
        assert cursor.fetchone()[0] is None
    assert GpuSample.objects.count() == 1  # recent data stays
    record = PartitionDrop.objects.get(partition=old_partition)
    assert record.table == "fleet_gpusample" and record.rows == 5 and record.bytes > 0
    assert record.range_start == partitions.SAMPLES.start_of(old)
    # The writer still works after the drop (it re-makes what it needs).
    store(site_a, "again", sample(gpu_uuid=A0, hostname="a-1", ts=NOW + timedelta(seconds=1)))
    assert GpuSample.objects.count() == 2


def test_partitions_are_made_ahead(db) -> None:
    partitions.make_partitions_ahead(days=2)
    names = set(partitions.existing_partitions(partitions.SAMPLES))
    for offset in range(3):
        day = partitions.SAMPLES.start_of(datetime.now(UTC) + timedelta(days=offset))
        assert partitions.SAMPLES.partition_name(day) in names
    assert partitions.make_partitions_ahead(days=2) == []  # idempotent
