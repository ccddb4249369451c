"""Past 30 days only the 1-hour rollups are kept; each level's bytes per GPU per day is measured.

Raw samples go after GOODPUT_RAW_RETENTION_DAYS (7), minute rollups after 30 days, hour rollups
(monthly partitions) after GOODPUT_ROLLUP_1H_RETENTION_DAYS (400); the settings refuse a raw or
minute retention past 30 days.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from django.core.management import call_command
from django.db import connection

from fleet.ingest.batches import GpuSampleIn
from fleet.models import Gpu, GpuRollup1h, GpuRollup1m, GpuSample, GroupRollup1h, GroupRollup1m, PartitionDrop, Site
from fleet.telemetry import footprint, partitions
from fleet.telemetry.rollups import update_rollups
from fleet.telemetry.store import store_gpu_samples
from tests.conftest import make_sample
from tests.console.test_settings import start

NOW = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)


def _samples(site: Site, key: str, moments: list[datetime], uuid: str = "GPU-retention-0") -> None:
    batch = []
    for ts in moments:
        values = make_sample(gpu_uuid=uuid, hostname="ret-1", ts=ts)
        batch.append(msgspec.convert(values, GpuSampleIn, from_attributes=False, strict=False))
    store_gpu_samples(site_id=site.id, batch_key=key, samples=batch)


def _rollup(model: type, table: partitions.PartitionedTable, bucket: datetime, **fields: object) -> None:
    partitions.ensure_partitions_for(table, [bucket])
    defaults = {"util_mean": 50.0, "temp_mean": 60.0, "power_mean": 500.0, "energy_j": 1.0}
    model.objects.create(bucket=bucket, **defaults, **fields)


def _gpu_rollup(model: type, table: partitions.PartitionedTable, gpu: Gpu, bucket: datetime) -> None:
    _rollup(model, table, bucket, gpu=gpu, samples=6)


def _group_rollup(model: type, table: partitions.PartitionedTable, bucket: datetime) -> None:
    _rollup(model, table, bucket, scope="fleet", scope_id=0, gpus=1, power_sum=500.0)


def _exists(partition: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [partition])
        return cursor.fetchone()[0] is not None


def test_past_thirty_days_only_the_hour_rollups_are_kept(site_a: Site, settings) -> None:
    settings.RAW_RETENTION_DAYS = 7
    settings.ROLLUP_1M_RETENTION_DAYS = 30
    settings.ROLLUP_1H_RETENTION_DAYS = 400
    _samples(site_a, "old", [NOW - timedelta(days=10)])
    _samples(site_a, "recent", [NOW - timedelta(days=5), NOW])
    gpu = Gpu.objects.get(uuid="GPU-retention-0")
    for days in (45, 29, 0):
        _gpu_rollup(GpuRollup1m, partitions.GPU_ROLLUP_1M, gpu, NOW - timedelta(days=days))
        _group_rollup(GroupRollup1m, partitions.GROUP_ROLLUP_1M, NOW - timedelta(days=days))
    for days in (500, 200, 45, 0):
        _gpu_rollup(GpuRollup1h, partitions.GPU_ROLLUP_1H, gpu, NOW - timedelta(days=days))
        _group_rollup(GroupRollup1h, partitions.GROUP_ROLLUP_1H, NOW - timedelta(days=days))

    partitions.drop_expired_partitions()

    # Raw: 10 days old gone, 5 days old kept.
    assert sorted(GpuSample.objects.values_list("ts", flat=True)) == [NOW - timedelta(days=5), NOW]
    # Minutes: 45 days old gone (GPU and group rows alike), 29 days old kept.
    expected_minutes = [NOW - timedelta(days=29), NOW]
    assert sorted(GpuRollup1m.objects.values_list("bucket", flat=True)) == expected_minutes
    assert sorted(GroupRollup1m.objects.values_list("bucket", flat=True)) == expected_minutes
    assert not _exists(
        partitions.GPU_ROLLUP_1M.partition_name(partitions.GPU_ROLLUP_1M.start_of(NOW - timedelta(days=45)))
    )
    # Hours: 45 and 200 days old kept; only the month wholly past 400 days is dropped.
    expected_hours = [NOW - timedelta(days=200), NOW - timedelta(days=45), NOW]
    assert sorted(GpuRollup1h.objects.values_list("bucket", flat=True)) == expected_hours
    assert sorted(GroupRollup1h.objects.values_list("bucket", flat=True)) == expected_hours
    dropped = set(PartitionDrop.objects.values_list("table", flat=True))
    assert dropped == {
        "fleet_gpusample",
        "fleet_gpurollup_1m",
        "fleet_grouprollup_1m",
        "fleet_gpurollup_1h",
        "fleet_grouprollup_1h",
    }
    old_month = partitions.GPU_ROLLUP_1H.partition_name(partitions.GPU_ROLLUP_1H.start_of(NOW - timedelta(days=500)))
    assert PartitionDrop.objects.get(partition=old_month).rows == 1


def test_an_hour_rollup_month_is_kept_until_all_of_it_is_past_retention(site_a: Site, settings) -> None:
    settings.ROLLUP_1H_RETENTION_DAYS = 400
    _samples(site_a, "one", [NOW])
    gpu = Gpu.objects.get(uuid="GPU-retention-0")
    # A month that began 405 days ago but ends within the 400: its latest hours are still wanted.
    table = partitions.GPU_ROLLUP_1H
    start = table.start_of(NOW - timedelta(days=400))
    _gpu_rollup(GpuRollup1h, table, gpu, start)
    partitions.drop_expired_partitions(now=start + timedelta(days=400, hours=1))
    assert GpuRollup1h.objects.filter(bucket=start).exists()
    partitions.drop_expired_partitions(now=table.next_start(start) + timedelta(days=400))
    assert not GpuRollup1h.objects.filter(bucket=start).exists()


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"GOODPUT_ROLLUP_1M_RETENTION_DAYS": "31"}, "GOODPUT_ROLLUP_1M_RETENTION_DAYS=31 is above the maximum of 30"),
        ({"GOODPUT_RAW_RETENTION_DAYS": "60"}, "GOODPUT_RAW_RETENTION_DAYS=60 is above the maximum of 30"),
        ({"GOODPUT_ROLLUP_1H_RETENTION_DAYS": "14"}, "GOODPUT_ROLLUP_1H_RETENTION_DAYS=14 is below the minimum of 30"),
        (
            {"GOODPUT_RAW_RETENTION_DAYS": "20", "GOODPUT_ROLLUP_1M_RETENTION_DAYS": "10"},
            "the minute rollups must last at least as long as the samples",
        ),
    ],
)
def test_only_the_hour_rollups_may_be_kept_past_thirty_days(variables: dict[str, str], message: str) -> None:
    result = start(**variables)
    assert result.returncode != 0
    assert message in result.stderr


def test_bytes_per_gpu_per_day_are_measured_for_raw_and_each_rollup_level(site_a: Site) -> None:
    # Two GPUs, every 10 s for 30 minutes, rolled up.
    start_at = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=40)
    moments = [start_at + timedelta(seconds=10 * i) for i in range(180)]
    _samples(site_a, "g0", moments, uuid="GPU-footprint-0")
    _samples(site_a, "g1", moments, uuid="GPU-footprint-1")
    update_rollups()
    GpuRollup1h.objects.all().delete()
    _gpu_rollup(GpuRollup1h, partitions.GPU_ROLLUP_1H, Gpu.objects.get(uuid="GPU-footprint-0"), start_at)

    levels = {level.level: level for level in footprint.measure()}

    raw = levels["raw"]
    assert raw.gpus == 2
    assert raw.days == pytest.approx((moments[-1] - moments[0]) / timedelta(days=1))
    with connection.cursor() as cursor:
        names = list(partitions.existing_partitions(partitions.SAMPLES))
        sizes = []
        for name in names:
            cursor.execute(f'SELECT count(*), pg_total_relation_size(%s::regclass) FROM "{name}"', [name])
            rows, size = cursor.fetchone()
            if rows:
                sizes.append(size)
    assert raw.bytes == sum(sizes) > 0
    assert raw.bytes_per_gpu_day == pytest.approx(sum(sizes) / 2 / raw.days)
    minute = levels["1m"]
    assert [t.table for t in minute.tables] == ["fleet_gpurollup_1m", "fleet_grouprollup_1m"]
    assert minute.bytes > 0 and minute.days > 0
    assert minute.steady_state_bytes_per_gpu == pytest.approx(minute.bytes_per_gpu_day * 30)
    hour = levels["1h"]
    assert hour.days == pytest.approx(1 / 24)  # one bucket of an hour
    assert hour.retention_days == 400

    out = io.StringIO()
    call_command("telemetry_footprint", stdout=out)
    line = out.getvalue().strip().splitlines()[-1]
    assert line == footprint.result_line(footprint.measure())
    assert line.startswith("RESULT storage gpus=2 raw_bytes_per_gpu_day=")
    assert f"raw_bytes_per_gpu_day={raw.bytes_per_gpu_day:.0f}" in line
