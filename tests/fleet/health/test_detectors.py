"""GPU-health detectors: from telemetry to findings, through the incident engine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from fleet.models import Gpu, GpuState, IngestBatch, Node, Rack, Site
from fleet.telemetry.store import store_gpu_samples
from incidents import detectors
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident
from incidents.services.engine import auto_resolve_due
from tests.fleet.telemetry.test_rollups_and_retention import sample

GPU = "GPU-11111111-0000-0000-0000-000000000000"
pytestmark = pytest.mark.django_db


def put(site: Site, *samples) -> None:  # type: ignore[no-untyped-def]
    store_gpu_samples(
        site_id=site.id, batch_key=f"k{datetime.now(UTC).timestamp()}{id(samples)}", samples=list(samples)
    )


def now() -> datetime:
    return timezone.now()


def gpu_sample(seconds_ago: float = 0, **values):  # type: ignore[no-untyped-def]
    base = {"gpu_uuid": GPU, "hostname": "gpu-a-001", "gpu_index": 1, "xid": 0, "ecc_dbe_total": 0}
    return sample(**{**base, **values, "ts": now() - timedelta(seconds=seconds_ago)})


def test_a_critical_xid_opens_one_incident_not_one_per_sample_and_resolves_when_healthy(site_a, settings) -> None:
    settings.INCIDENT_HOLD_DOWN_SECONDS = 60
    for i in range(3):
        put(
            site_a,
            gpu_sample(30 - i * 10, xid=79),
            *[
                sample(gpu_uuid=f"GPU-1111111{n}-0000", hostname="gpu-a-001", gpu_index=n, ts=now())
                for n in range(2, 8)
            ],
        )
        run_detectors(only=["critical-xid"])
    incident = Incident.objects.get()
    assert incident.severity == "SEV2" and incident.category == "gpu-health"
    assert incident.title == "XID 79 (GPU has fallen off the bus) on gpu-a-001 GPU 1"
    assert incident.labels == {
        "site": "ams-1",
        "hostname": "gpu-a-001",
        "gpu": GPU,
        "gpu_index": "1",
        "model": "NVIDIA H100 80GB HBM3",
        "xid": "79",
        "detector": "critical-xid",
    }
    assert incident.affected_gpus == 7  # XID 79 drains the node: all of its GPUs are out
    finding = Finding.objects.get()
    assert finding.times_seen == 3 and finding.source == "detector:critical-xid"
    put(site_a, gpu_sample(0, xid=0))  # the GPU is healthy again (reset)
    run_detectors(only=["critical-xid"])
    finding.refresh_from_db()
    assert finding.status == "cleared"
    assert auto_resolve_due(now=now() + timedelta(seconds=61)) == [incident.pk]
    incident.refresh_from_db()
    assert incident.state == "resolved" and incident.current_gpu_hours() > 0


@pytest.mark.parametrize(("xid", "severity"), [(48, "SEV2"), (63, "SEV3"), (94, "SEV3"), (119, "SEV2")])
def test_xid_severities_follow_the_catalogue(site_a, xid, severity) -> None:
    put(site_a, gpu_sample(xid=xid))
    run_detectors(only=["critical-xid"])
    assert Incident.objects.get().severity == severity


def test_a_benign_xid_raises_nothing(site_a) -> None:
    put(site_a, gpu_sample(xid=13))
    run_detectors(only=["critical-xid"])
    assert not Finding.objects.exists()


def test_double_bit_ecc_and_remapped_rows_rising(site_a) -> None:
    put(
        site_a,
        gpu_sample(120, ecc_dbe_total=0, remapped_rows_uncorrectable=1),
        gpu_sample(60, ecc_dbe_total=0, remapped_rows_uncorrectable=1),
    )
    run_detectors(only=["ecc-double-bit", "remapped-rows"])
    assert not Finding.objects.exists()  # a steady count of remapped rows is history, not a new fault
    put(site_a, gpu_sample(0, ecc_dbe_total=1, remapped_rows_uncorrectable=2))
    run_detectors(only=["ecc-double-bit", "remapped-rows"])
    found = {f.fingerprint.split(":")[0]: f for f in Finding.objects.all()}
    assert set(found) == {"ecc-dbe", "remap-unc"}
    assert found["ecc-dbe"].severity == "SEV2" and "+1 in 10 min" in found["ecc-dbe"].summary
    assert Incident.objects.count() == 1  # the same GPU's findings group into one incident


def test_a_double_bit_count_above_zero_on_first_sight_is_a_finding(site_a, settings) -> None:
    # The count is volatile (since the driver loaded): a GPU first seen with 2 has had two
    # uncorrectable errors that nothing has cleared yet, even though the count never rises here.
    put(site_a, gpu_sample(0, ecc_dbe_total=2))
    stale_ts = now() - timedelta(seconds=settings.FLEET_STALE_SECONDS + 30)
    put(
        site_a,
        sample(gpu_uuid="GPU-55555555-0000", hostname="gpu-a-005", ts=stale_ts, ecc_dbe_total=2),
        sample(gpu_uuid="GPU-66666666-0000", hostname="gpu-a-006", ts=now(), ecc_dbe_total=0),
    )
    run_detectors(only=["ecc-double-bit"])
    finding = Finding.objects.get()  # not the stale GPU's old count, nor the clean GPU
    assert finding.fingerprint == f"ecc-dbe:{GPU}" and finding.severity == "SEV2"
    assert "2 since the driver loaded" in finding.summary
    put(site_a, gpu_sample(0, ecc_dbe_total=0))  # a driver reload clears the volatile count
    run_detectors(only=["ecc-double-bit"])
    finding.refresh_from_db()
    assert finding.status == "cleared"


def test_row_remap_failure(site_a) -> None:
    put(site_a, gpu_sample(row_remap_failure=1))
    run_detectors(only=["row-remap-failure"])
    assert "needs replacing" in Finding.objects.get().summary


def test_thermal_throttling_needs_heat_load_and_a_slowed_clock(site_a) -> None:
    cool = sample(
        gpu_uuid="GPU-22222222-0000", hostname="gpu-a-002", ts=now(), gpu_temp_c=60, sm_clock_mhz=1980, gpu_util=99
    )
    put(site_a, cool, gpu_sample(gpu_temp_c=89, sm_clock_mhz=1100, gpu_util=98, throttle_reasons=0x40))
    run_detectors(only=["thermal-throttling"])
    finding = Finding.objects.get()
    assert finding.fingerprint == f"thermal:{GPU}" and "89 °C" in finding.summary
    idle_hot = sample(
        gpu_uuid="GPU-33333333-0000", hostname="gpu-a-003", ts=now(), gpu_temp_c=90, sm_clock_mhz=300, gpu_util=3
    )
    put(site_a, idle_hot)
    run_detectors(only=["thermal-throttling"])
    assert Finding.objects.count() == 1  # not busy: a slow clock on an idle GPU is normal


def test_power_capping_for_most_of_the_window(site_a) -> None:
    put(site_a, *[gpu_sample(s, throttle_reasons=0x4) for s in (500, 400, 300, 200, 100, 0)])
    run_detectors(only=["power-capping"])
    assert Finding.objects.get().severity == "SEV4"


def test_thermal_throttling_from_the_violation_counter_when_no_bitmask_is_exported(site_a) -> None:
    # An older exporter: no clocks-event bitmask, only cumulative time throttled. The GPU is
    # neither hot nor busy by the gauges, but the counter says it spent 4 s throttled.
    counter_only = {"throttle_reasons": None, "gpu_util": 30, "gpu_temp_c": 70}
    put(
        site_a,
        gpu_sample(120, thermal_violation_us=1_000_000, **counter_only),
        gpu_sample(60, thermal_violation_us=1_000_000, **counter_only),
        gpu_sample(0, thermal_violation_us=5_000_000, **counter_only),
    )
    for uuid, values in (
        ("GPU-77777777-0000", (9_000_000, 9_000_000, 9_000_000)),  # steady: throttled before, not now
        ("GPU-77777777-0001", (9_000_000, 0, 0)),  # a driver reload: a reset to zero, not a rise of -9 s
    ):
        put(
            site_a,
            *[
                sample(
                    gpu_uuid=uuid,
                    hostname="gpu-a-007",
                    ts=now() - timedelta(seconds=ago),
                    throttle_reasons=None,
                    thermal_violation_us=v,
                )
                for ago, v in zip((120, 60, 0), values, strict=True)
            ],
        )
    # A GPU that exports the bitmask is judged by it, as before: a clear bitmask is no throttling.
    bitmask = "GPU-77777777-0002"
    put(
        site_a,
        sample(gpu_uuid=bitmask, hostname="gpu-a-008", ts=now() - timedelta(seconds=60), thermal_violation_us=0),
        sample(gpu_uuid=bitmask, hostname="gpu-a-008", ts=now(), thermal_violation_us=3_000_000, throttle_reasons=0),
    )
    run_detectors(only=["thermal-throttling"])
    finding = Finding.objects.get()
    assert finding.fingerprint == f"thermal:{GPU}" and "4.0 s throttled in 10 min" in finding.summary


def test_power_capping_from_the_violation_counter_when_no_bitmask_is_exported(site_a) -> None:
    seconds = (500, 400, 300, 200, 100, 0)
    put(
        site_a,
        *[gpu_sample(s, throttle_reasons=None, power_violation_us=1_000_000 * (600 - s), gpu_util=40) for s in seconds],
    )
    once = "GPU-88888888-0000"  # throttled in one interval of five: not most of the window
    put(
        site_a,
        *[
            sample(
                gpu_uuid=once,
                hostname="gpu-a-009",
                ts=now() - timedelta(seconds=s),
                throttle_reasons=None,
                power_violation_us=0 if s > 100 else 2_000_000,
            )
            for s in seconds
        ],
    )
    run_detectors(only=["power-capping"])
    finding = Finding.objects.get()
    assert finding.fingerprint == f"power-cap:{GPU}" and finding.severity == "SEV4"


def test_pcie_replay_rate(site_a) -> None:
    put(site_a, gpu_sample(300, pcie_replay_total=10), gpu_sample(0, pcie_replay_total=500))
    run_detectors(only=["pcie-replays"])
    assert "+490 in 10 min" in Finding.objects.get().summary


def test_a_gpu_silent_for_three_intervals(site_a, settings) -> None:
    # Silence is judged against the GPU's own node: its sibling reports, it does not.
    settings.FLEET_SAMPLE_INTERVAL_SECONDS = 10
    for seconds_ago in range(300, 0, -10):  # the console has been receiving all along
        IngestBatch.objects.create(
            key=f"history-{seconds_ago}", site=site_a, samples=1, received_at=now() - timedelta(seconds=seconds_ago)
        )
    put(site_a, gpu_sample(45))
    put(site_a, sample(gpu_uuid="GPU-44444444-0000", hostname="gpu-a-001", gpu_index=4, ts=now()))
    run_detectors(only=["gpu-silent"])
    finding = Finding.objects.get()
    assert finding.fingerprint == f"silent:{GPU}" and finding.labels["hostname"] == "gpu-a-001"
    put(site_a, gpu_sample(0))
    run_detectors(only=["gpu-silent"])
    assert Finding.objects.get().status == "cleared"


def test_a_failing_detector_is_reported_as_its_own_finding_while_the_others_run(site_a, monkeypatch) -> None:
    def broken(at: datetime) -> list:
        raise RuntimeError("telemetry store unreachable")

    monkeypatch.setitem(detectors._detectors, "broken", broken)
    put(site_a, gpu_sample(xid=79))
    report = run_detectors()
    assert report["broken"] == {"error": "telemetry store unreachable"}
    assert report["critical-xid"] == {"firing": 1}
    failure = Finding.objects.get(fingerprint="detector-failed:broken")
    assert failure.severity == "SEV4" and "telemetry store unreachable" in failure.summary
    monkeypatch.setitem(detectors._detectors, "broken", lambda at: [])
    run_detectors(only=["broken"])
    failure.refresh_from_db()
    assert failure.status == "cleared"


def test_findings_carry_site_node_and_gpu_labels(site_a) -> None:
    Node.objects.create(site=site_a, hostname="gpu-a-001")
    put(site_a, gpu_sample(xid=74))
    run_detectors(only=["critical-xid"])
    labels = Finding.objects.get().labels
    assert (labels["site"], labels["hostname"], labels["gpu"]) == ("ams-1", "gpu-a-001", GPU)
    assert Gpu.objects.get(uuid=GPU).node.hostname == labels["hostname"]
    assert GpuState.objects.get().xid == 74


def test_mttd_counts_from_the_first_sample_carrying_the_xid(site_a) -> None:
    put(site_a, gpu_sample(200, xid=0), gpu_sample(120, xid=79), gpu_sample(60, xid=79), gpu_sample(0, xid=79))
    run_detectors(only=["critical-xid"])
    incident = Incident.objects.get()
    assert 115 <= (incident.detected_at - incident.started_at).total_seconds() <= 130


def test_findings_for_a_gpu_on_a_racked_node_carry_its_rack(site_a) -> None:
    # A rack-scope maintenance window or silence matches on the rack label.
    rack = Rack.objects.create(site=site_a, name="r12")
    Node.objects.create(site=site_a, hostname="gpu-a-001", rack=rack)
    put(site_a, gpu_sample(xid=74))
    run_detectors(only=["critical-xid"])
    assert Finding.objects.get().labels["rack"] == "r12"


def test_findings_for_a_gpu_on_an_unracked_node_carry_no_rack(site_a) -> None:
    put(site_a, gpu_sample(xid=74))
    run_detectors(only=["critical-xid"])
    assert "rack" not in Finding.objects.get().labels


def test_a_gpu_quiet_for_longer_than_the_silent_horizon_is_decommissioned_and_its_findings_clear(site_a) -> None:
    put(site_a, gpu_sample(xid=79))
    run_detectors(only=["critical-xid"])
    finding = Finding.objects.get()

    # Quiet for a day less a minute: off the bus, still in service; its finding holds.
    GpuState.objects.update(
        ts=now() - timedelta(hours=23, minutes=59), updated_at=now() - timedelta(hours=23, minutes=59)
    )
    run_detectors(only=["critical-xid"])
    finding.refresh_from_db()
    assert finding.status == "firing"

    GpuState.objects.update(ts=now() - timedelta(hours=25), updated_at=now() - timedelta(hours=25))
    run_detectors(only=["critical-xid"])
    finding.refresh_from_db()
    assert finding.status == "cleared"


def test_a_deleted_gpus_findings_clear(site_a) -> None:
    put(site_a, gpu_sample(xid=79))
    run_detectors(only=["critical-xid"])
    Gpu.objects.filter(uuid=GPU).delete()
    run_detectors(only=["critical-xid"])
    assert Finding.objects.get().status == "cleared"


def test_a_condition_that_ended_and_came_back_started_when_it_came_back(site_a) -> None:
    put(
        site_a,
        gpu_sample(500, throttle_reasons=0x40),
        gpu_sample(400, throttle_reasons=0),  # healthy in between
        *[gpu_sample(s, throttle_reasons=0x40) for s in (300, 200, 100, 0)],
    )
    run_detectors(only=["thermal-throttling"])
    finding = Finding.objects.get()
    assert 295 <= (finding.last_seen - finding.started_at).total_seconds() <= 310
