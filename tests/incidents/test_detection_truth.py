"""Findings an SRE can trust at 3 a.m. (issue 10, items 1-5 and 7): no page for the console's own
outage, counters read as Prometheus increase() does, throttling found whatever the load, missing
data is not health, true fault times, and flapping held on one incident."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import count
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from fleet.choices import ScrapeHealth
from fleet.models import GpuState, IngestBatch, Node, Rack, ScrapeTarget, Site
from fleet.telemetry.store import store_gpu_samples
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident, TimelineEntry
from incidents.services.engine import auto_resolve_due, clear_finding, raise_finding
from tests.fleet.telemetry.test_rollups_and_retention import sample

pytestmark = pytest.mark.django_db
_keys = count()
NODE_1 = ("gpu-a-001", ["GPU-a1000000-0000", "GPU-a1000001-0000"])
NODE_2 = ("gpu-a-002", ["GPU-a2000000-0000", "GPU-a2000001-0000"])
XID_GPU = NODE_1[1][0]


def now() -> datetime:
    return timezone.now()


def put(site: Site, *samples: Any) -> None:
    store_gpu_samples(site_id=site.id, batch_key=f"batch-{next(_keys)}", samples=list(samples))


def gpu(uuid: str, hostname: str, seconds_ago: float = 0, **values: Any) -> Any:
    index = int(uuid.split("-")[1][-1])  # GPU-a1000001-0000 is GPU 1
    return sample(
        gpu_uuid=uuid, hostname=hostname, gpu_index=index, ts=now() - timedelta(seconds=seconds_ago), **values
    )


def report(site: Site, *nodes: tuple[str, list[str]], seconds_ago: float = 0, **values: Any) -> None:
    """One batch from each node's agent: a sample of each of its GPUs."""
    for hostname, uuids in nodes:
        put(site, *[gpu(u, hostname, seconds_ago, **values) for u in uuids])


def steady_ingest(site: Site, *, start: datetime, end: datetime, every: float = 15) -> None:
    """The console received batches steadily from ``start`` to ``end`` (its IngestBatch rows)."""
    t = start
    while t <= end:
        IngestBatch.objects.create(key=f"history-{next(_keys)}", site=site, samples=1, received_at=t)
        t += timedelta(seconds=every)


def heard_ago(seconds: float, *, hostnames: list[str] | None = None, uuids: list[str] | None = None) -> None:
    """Move GPUs' last sample and last reception back in time, as if nothing came since."""
    states = GpuState.objects.all()
    if hostnames is not None:
        states = states.filter(gpu__node__hostname__in=hostnames)
    if uuids is not None:
        states = states.filter(gpu__uuid__in=uuids)
    delta = timedelta(seconds=seconds)
    states.update(ts=F("ts") - delta, updated_at=F("updated_at") - delta)


def gpu_incidents() -> Any:
    return Incident.objects.exclude(category="console")


# --- 1. the console's own outage is not a GPU fault ---------------------------------------------


def test_console_down_three_minutes_then_back_opens_no_gpu_incident_and_pages_nobody(site_a) -> None:
    # Agents reported steadily until the console went down three minutes ago.
    report(site_a, NODE_1, NODE_2)
    heard_ago(180)
    IngestBatch.objects.update(received_at=F("received_at") - timedelta(seconds=180))
    steady_ingest(site_a, start=now() - timedelta(minutes=10), end=now() - timedelta(seconds=180))

    run_detectors()  # the first cycle after the restart, before any agent got through

    # A restart is not an outage of the ingest: nothing raised, nobody paged.
    assert not Finding.objects.exists()
    assert not Incident.objects.exists()

    report(site_a, NODE_1)  # the agents get through one by one
    run_detectors()
    report(site_a, NODE_2)
    run_detectors()

    assert not Finding.objects.exists()
    assert not Incident.objects.exists()


def detector_loop(*, seconds: int, every: int = 15, only: list[str] | None = None) -> None:
    """The detector loop ran every ``every`` seconds for the last ``seconds``, up to now."""
    end = now()
    for back in range(seconds, -1, -every):
        run_detectors(now=end - timedelta(seconds=back), only=only)


def test_ingest_silent_while_the_detector_loop_runs_steadily_raises_the_console_finding(site_a, settings) -> None:
    settings.FLEET_SAMPLE_INTERVAL_SECONDS = 15
    report(site_a, NODE_1, NODE_2)
    heard_ago(180)  # the console's ingest stopped three minutes ago; the console itself did not

    detector_loop(seconds=60, only=["gpu-silent", "ingest-silent"])

    assert not gpu_incidents().exists()
    console = Finding.objects.get()  # one finding, about the console itself
    assert console.fingerprint == "ingest-silent:console" and console.labels["component"] == "ingest"
    assert "stored no GPU telemetry since" in console.summary

    report(site_a, NODE_1, NODE_2)  # ingest is back
    run_detectors(only=["gpu-silent", "ingest-silent"])
    console.refresh_from_db()
    assert console.status == "cleared"
    assert not gpu_incidents().exists()


def test_every_gpu_silent_while_serving_metrics_arrive_is_reported(site_a, settings) -> None:
    settings.FLEET_SAMPLE_INTERVAL_SECONDS = 15
    report(site_a, NODE_1, NODE_2)
    heard_ago(180)  # every GPU source died three minutes ago...
    # ...while vLLM scrapes kept claiming batch keys.
    steady_ingest(site_a, start=now() - timedelta(minutes=10), end=now())

    detector_loop(seconds=60, only=["gpu-silent", "ingest-silent"])

    assert list(Finding.objects.values_list("fingerprint", flat=True)) == ["ingest-silent:console"]


def test_a_quiet_node_is_one_finding_for_the_node_not_one_per_gpu(site_a, settings) -> None:
    settings.FLEET_SAMPLE_INTERVAL_SECONDS = 15
    steady_ingest(site_a, start=now() - timedelta(minutes=5), end=now())
    report(site_a, NODE_2)
    heard_ago(60, hostnames=[NODE_2[0]])  # node 2's agent stopped a minute ago
    report(site_a, NODE_1)  # node 1's keeps reporting

    run_detectors(only=["gpu-silent"])

    finding = Finding.objects.get()
    assert finding.fingerprint == f"silent-node:{NODE_2[0]}"
    assert finding.labels == {"site": "ams-1", "hostname": NODE_2[0], "detector": "gpu-silent"}
    incident = Incident.objects.get()
    assert incident.affected_gpus == 2  # the node's GPUs, counted once

    report(site_a, NODE_2)  # back
    run_detectors(only=["gpu-silent"])
    finding.refresh_from_db()
    assert finding.status == "cleared"


def test_a_quiet_racked_node_finding_carries_its_rack(site_a, settings) -> None:
    # A rack-scope maintenance window must cover the silence of a node in that rack.
    settings.FLEET_SAMPLE_INTERVAL_SECONDS = 15
    steady_ingest(site_a, start=now() - timedelta(minutes=5), end=now())
    report(site_a, NODE_1, NODE_2)
    Node.objects.filter(hostname=NODE_2[0]).update(rack=Rack.objects.create(site=site_a, name="r7"))
    heard_ago(60, hostnames=[NODE_2[0]])

    run_detectors(only=["gpu-silent"])

    finding = Finding.objects.get()
    assert finding.fingerprint == f"silent-node:{NODE_2[0]}"
    assert finding.labels["rack"] == "r7"


def test_a_quiet_site_is_one_finding_for_the_site(site_a, site_b) -> None:
    steady_ingest(site_a, start=now() - timedelta(minutes=5), end=now())
    report(site_b, ("gpu-b-001", ["GPU-b1000000-0000"]), ("gpu-b-002", ["GPU-b2000000-0000"]))
    heard_ago(120)
    report(site_a, NODE_1, NODE_2)

    run_detectors(only=["gpu-silent", "ingest-silent"])

    assert list(Finding.objects.values_list("fingerprint", flat=True)) == ["silent-site:iad-2"]


def test_a_site_whose_batches_wait_in_the_consoles_own_queue_is_not_silent(site_a, site_b, broker_mode) -> None:
    # A writer killed mid-batch holds the queue for a minute: iad-2's batches were accepted and
    # wait there, while ams-1's telemetry (pushed, another path) is stored. Not iad-2's silence.
    from fleet.ingest import stream as ingest_stream

    steady_ingest(site_a, start=now() - timedelta(minutes=5), end=now())
    report(site_b, ("gpu-b-001", ["GPU-b1000000-0000"]), ("gpu-b-002", ["GPU-b2000000-0000"]))
    heard_ago(120)
    report(site_a, NODE_1, NODE_2)
    queued_ms = int((now() - timedelta(seconds=40)).timestamp() * 1000)
    broker_mode.xadd(ingest_stream.STREAM, {"k": "waiting", "s": site_b.id, "n": 2}, id=f"{queued_ms}-0")
    assert 39 < ingest_stream.oldest_waiting_seconds() < 60

    run_detectors(only=["gpu-silent", "ingest-silent"])
    assert not Finding.objects.exists()

    broker_mode.delete(ingest_stream.STREAM)  # written at last, yet still nothing new from iad-2
    run_detectors(only=["gpu-silent", "ingest-silent"])
    assert list(Finding.objects.values_list("fingerprint", flat=True)) == ["silent-site:iad-2"]


def test_a_scrape_target_down_is_one_finding_for_the_target_not_for_its_node(site_a) -> None:
    steady_ingest(site_a, start=now() - timedelta(minutes=5), end=now())
    ScrapeTarget.objects.create(
        site=site_a,
        name="dcgm-a-002",
        url="http://10.0.0.2:9400/metrics",
        hostname=NODE_2[0],
        health=ScrapeHealth.DOWN,
        last_scrape_at=now(),
        last_error="connection refused",
    )
    report(site_a, NODE_2)
    heard_ago(60, hostnames=[NODE_2[0]])
    report(site_a, NODE_1)

    run_detectors(only=["gpu-silent", "scrape-target-down"])

    finding = Finding.objects.get()
    assert finding.fingerprint == "scrape-down:ams-1/dcgm-a-002" and "connection refused" in finding.summary
    assert finding.labels["hostname"] == NODE_2[0]  # it joins the node's incident, if it has one


def test_a_gpu_whose_node_reports_without_it_is_silent(site_a, settings) -> None:
    settings.FLEET_SAMPLE_INTERVAL_SECONDS = 10
    steady_ingest(site_a, start=now() - timedelta(minutes=5), end=now())
    put(site_a, gpu(NODE_1[1][0], NODE_1[0], 45), gpu(NODE_1[1][1], NODE_1[0], 0))

    run_detectors(only=["gpu-silent"])

    finding = Finding.objects.get()
    assert finding.fingerprint == f"silent:{NODE_1[1][0]}" and finding.labels["hostname"] == NODE_1[0]


# --- 2. counters: a decrease is a reset ---------------------------------------------------------


@pytest.mark.parametrize(
    ("detector", "field", "before", "rise", "fingerprint"),
    [
        ("ecc-double-bit", "ecc_dbe_total", 4, 1, "ecc-dbe"),
        ("remapped-rows", "remapped_rows_uncorrectable", 5, 1, "remap-unc"),
        ("nvlink-crc-errors", "nvlink_crc_errors_total", 900, 150, "nvlink-crc"),
    ],
)
def test_a_counter_reset_then_a_rise_raises_exactly_one_finding_for_the_rise(
    site_a, detector, field, before, rise, fingerprint
) -> None:
    uuid, hostname = NODE_1[1][0], NODE_1[0]
    put(site_a, gpu(uuid, hostname, 100, **{field: before}), gpu(uuid, hostname, 50, **{field: 0}))

    run_detectors(only=[detector])
    assert not Finding.objects.exists()  # the drop is a driver reload, not errors

    put(site_a, gpu(uuid, hostname, 0, **{field: rise}))
    run_detectors(only=[detector])

    finding = Finding.objects.get()
    assert finding.fingerprint == f"{fingerprint}:{uuid}" and f"(+{rise} in 10 min)" in finding.summary


# --- 3. throttling whatever the load ------------------------------------------------------------


def test_a_throttled_gpu_at_twenty_percent_utilisation_is_found_in_the_first_cycle(site_a) -> None:
    put(site_a, gpu(XID_GPU, NODE_1[0], gpu_temp_c=90, gpu_util=20, sm_clock_mhz=1100, throttle_reasons=0x40))

    run_detectors(only=["thermal-throttling"])

    finding = Finding.objects.get()
    assert finding.fingerprint == f"thermal:{XID_GPU}" and "90 °C" in finding.summary


# --- 4. missing data is not health --------------------------------------------------------------


def test_an_xid_79_gpu_that_goes_quiet_stays_firing_and_its_silence_joins_the_incident(site_a, settings) -> None:
    settings.FLEET_SAMPLE_INTERVAL_SECONDS = 15
    steady_ingest(site_a, start=now() - timedelta(minutes=10), end=now())
    put(site_a, gpu(XID_GPU, NODE_1[0], xid=79), gpu(NODE_1[1][1], NODE_1[0]))
    run_detectors()
    xid = Finding.objects.get(fingerprint=f"xid:{XID_GPU}:79")

    heard_ago(settings.FLEET_STALE_SECONDS + 60, uuids=[XID_GPU])  # off the bus: nothing more from it
    put(site_a, gpu(NODE_1[1][1], NODE_1[0]))  # its sibling reports on
    run_detectors()

    xid.refresh_from_db()
    assert xid.status == "firing"
    silent = Finding.objects.get(fingerprint=f"silent:{XID_GPU}")
    assert silent.status == "firing" and silent.incident_id == xid.incident_id
    assert Incident.objects.count() == 1


def test_a_reporting_gpu_without_the_fault_clears_it(site_a) -> None:
    put(site_a, gpu(XID_GPU, NODE_1[0], xid=79))
    run_detectors(only=["critical-xid"])
    put(site_a, gpu(XID_GPU, NODE_1[0], xid=0))
    run_detectors(only=["critical-xid"])
    assert Finding.objects.get().status == "cleared"


# --- 5. true fault times ------------------------------------------------------------------------


def test_mttd_of_thermal_throttling_counts_from_the_first_throttled_sample(site_a) -> None:
    hot = {"gpu_temp_c": 90, "gpu_util": 95, "sm_clock_mhz": 1100, "throttle_reasons": 0x40}
    first_bad = gpu(XID_GPU, NODE_1[0], 90, **hot)
    put(site_a, gpu(XID_GPU, NODE_1[0], 110), first_bad, *[gpu(XID_GPU, NODE_1[0], s, **hot) for s in (60, 30, 0)])

    run_detectors(only=["thermal-throttling"])

    incident = Incident.objects.get()
    assert incident.started_at == first_bad.ts
    assert 89 <= (incident.detected_at - incident.started_at).total_seconds() <= 95


def test_mttd_of_double_bit_ecc_counts_from_the_first_sample_showing_it(site_a) -> None:
    first_bad = gpu(XID_GPU, NODE_1[0], 80, ecc_dbe_total=1)
    put(site_a, gpu(XID_GPU, NODE_1[0], 100), first_bad, gpu(XID_GPU, NODE_1[0], 40, ecc_dbe_total=1))

    run_detectors(only=["ecc-double-bit"])

    incident = Incident.objects.get()
    assert incident.started_at == first_bad.ts
    assert 79 <= (incident.detected_at - incident.started_at).total_seconds() <= 85


def test_mttr_counts_to_when_the_condition_ended_not_to_the_hold_down(site_a, settings) -> None:
    settings.INCIDENT_HOLD_DOWN_SECONDS = 300
    put(site_a, gpu(XID_GPU, NODE_1[0], gpu_temp_c=90, throttle_reasons=0x40))
    run_detectors(only=["thermal-throttling"])
    put(site_a, gpu(XID_GPU, NODE_1[0], gpu_temp_c=70, throttle_reasons=0))
    healthy_seen = now()
    run_detectors(only=["thermal-throttling"], now=healthy_seen)

    incident = Incident.objects.get()
    assert auto_resolve_due(now=healthy_seen + timedelta(seconds=301)) == [incident.pk]
    incident.refresh_from_db()
    assert incident.state == "resolved" and incident.resolved_at == healthy_seen


# --- 7. flapping --------------------------------------------------------------------------------


def test_a_finding_that_flaps_is_held_on_one_incident_not_retriggered(settings) -> None:
    settings.FINDING_FLAP_LIMIT = 4
    settings.INCIDENT_HOLD_DOWN_SECONDS = 0
    start = now()

    def cycle(minute: int) -> None:
        raise_finding("thermal:GPU-f", {"hostname": "gpu-f-001", "gpu": "GPU-f"}, "SEV3", "Thermal throttling")
        clear_finding("thermal:GPU-f", source="detector:thermal-throttling", at=start + timedelta(minutes=minute))
        auto_resolve_due(now=start + timedelta(minutes=minute, seconds=1))

    for minute in range(1, 5):  # four fires and clears: each a fresh page (the hold-down is 0)
        cycle(minute)
    assert Incident.objects.count() == 4 and not Incident.objects.open().exists()

    cycle(5)  # the fifth clear within the hour: flapping
    finding = Finding.objects.get()
    assert finding.status == "firing" and finding.flapping_since is not None
    held = Incident.objects.open().get()
    assert held.flapping
    assert TimelineEntry.objects.filter(incident=held, text__startswith="Flapping: fired and cleared 5 times").exists()

    for minute in range(6, 12):  # it keeps flapping: no new incident, no new trigger
        cycle(minute)
    assert Incident.objects.count() == 5
    assert TimelineEntry.objects.filter(incident=held, text__startswith="Triggered").count() == 1
    held.refresh_from_db()
    assert held.state == "triggered"

    clear_finding("thermal:GPU-f", at=now() + timedelta(minutes=61))  # away for the whole window
    finding.refresh_from_db()
    assert finding.status == "cleared" and finding.flapping_since is None
    assert not Incident.objects.get(pk=held.pk).flapping


def _flapping(settings: Any, fingerprint: str = "thermal:GPU-h") -> Finding:
    """A finding held as flapping on an open incident (five fires and clears in five minutes)."""
    settings.FINDING_FLAP_LIMIT = 4
    start = now()
    for minute in range(1, 6):
        raise_finding(fingerprint, {"hostname": "gpu-h-001", "gpu": "GPU-h"}, "SEV3", "Thermal throttling")
        clear_finding(fingerprint, at=start + timedelta(minutes=minute))
    finding = Finding.objects.get(fingerprint=fingerprint)
    assert finding.status == "firing" and finding.flapping_since is not None and finding.incident.is_open
    return finding


def test_a_flapping_finding_that_simply_goes_away_is_released_by_the_hold_down_task(settings) -> None:
    from incidents.tasks import resolve_held_down_incidents

    finding = _flapping(settings)
    resolve_held_down_incidents()  # seen a moment ago: still held
    finding.refresh_from_db()
    assert finding.status == "firing" and finding.flapping_since is not None
    # Nothing raises it (or clears it) again for longer than the flap window.
    Finding.objects.filter(pk=finding.pk).update(last_seen=F("last_seen") - timedelta(hours=2))
    last_seen = Finding.objects.get(pk=finding.pk).last_seen
    resolve_held_down_incidents()
    finding.refresh_from_db()
    assert finding.status == "cleared" and finding.cleared_at == last_seen and finding.flapping_since is None
    incident = Incident.objects.get(pk=finding.incident_id)
    assert incident.state == "resolved" and incident.resolved_at == max(last_seen, incident.detected_at)
    assert incident.timeline.filter(text__startswith="Stopped flapping").exists()


def test_resolving_an_incident_by_hand_clears_its_flapping_findings(settings, operator_user) -> None:
    from incidents.services.engine import Actor, resolve_incident

    finding = _flapping(settings)
    resolve_incident(finding.incident, actor=Actor.person(operator_user))
    finding.refresh_from_db()
    assert finding.status == "cleared" and finding.cleared_at == finding.last_seen and finding.flapping_since is None
    # so its next return pages afresh rather than hiding under the resolved incident
    again = raise_finding(finding.fingerprint, finding.labels, "SEV3", "Thermal throttling")
    assert again.incident is not None and again.incident.is_open and again.incident_id != finding.incident_id
