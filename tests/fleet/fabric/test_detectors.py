"""The fabric detectors over node_exporter pushes through the Prometheus door: a link flap (with a
counter reset in the middle), a degrading link at and past its limits, RDMA congestion, severity
by fabric and by a gang job on the node, and nothing on steady counters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from fleet.fabric import detectors as fabric
from fleet.models import NodeInterface
from incidents.detectors import run_detectors
from incidents.models import Finding
from tests.fleet.fabric.node_exporter import HOST, push

pytestmark = pytest.mark.django_db

FABRIC = ["fabric-link-flap", "fabric-link-degrading", "fabric-rdma-congestion"]
SERIES = {
    "link_downed": ("node_infiniband_link_downed_total", "counter"),
    "link_error_recovery": ("node_infiniband_link_error_recovery_total", "counter"),
    "symbol_errors": ("node_infiniband_symbol_error_total", "counter"),
    "transmit_wait": ("node_infiniband_port_transmit_wait_total", "counter"),
    "transmit_discards": ("node_infiniband_port_discards_transmitted_total", "counter"),
    "state": ("node_infiniband_state_id", "gauge"),
    "rate": ("node_infiniband_rate_bytes_per_second", "gauge"),
}
STEADY = {
    "link_downed": 3,
    "link_error_recovery": 12,
    "symbol_errors": 40,
    "transmit_wait": 12884901,
    "transmit_discards": 5,
    "state": 4,
    "rate": 5e10,
}


def minute(n: int) -> datetime:
    """n minutes after a whole minute 30 minutes ago."""
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30) + timedelta(minutes=n)


def node_text(t: datetime, ports: dict[str, dict[str, float]], eth0_carrier: float | None = None) -> str:
    """node_exporter's exposition for these InfiniBand ports (device -> quantity -> value) at t."""
    ms = int(t.timestamp() * 1000)
    out = []
    for quantity, (name, kind) in SERIES.items():
        out.append(f"# TYPE {name} {kind}")
        for device, values in ports.items():
            out.append(f'{name}{{device="{device}",port="1"}} {values[quantity]} {ms}')
    if eth0_carrier is not None:
        out += [
            "# TYPE node_network_carrier_changes_total counter",
            f'node_network_carrier_changes_total{{device="eth0"}} {eth0_carrier} {ms}',
        ]
    return "\n".join(out) + "\n"


def feed(client: Client, token: str, series: list[dict[str, Any]], host: str = HOST, start: int = 0) -> None:
    """One push a minute for port mlx5_0 (and any other device named in a step's ``ports``)."""
    for k, values in enumerate(series):
        ports = values.get("ports") or {"mlx5_0": {**STEADY, **{q: v for q, v in values.items() if q in SERIES}}}
        body = node_text(minute(start + k), ports, values.get("eth0"))
        response = push(client, token, body, query=f"?hostname={host}")
        assert response.status_code == 202, response.content


def run(at: int) -> list[Finding]:
    fabric.port_window.cache_clear()
    run_detectors(now=minute(at) + timedelta(seconds=30), only=FABRIC)
    return list(Finding.objects.filter(status="firing").order_by("fingerprint"))


def test_steady_counters_raise_nothing(site_a, token_a) -> None:
    feed(Client(), token_a, [{} for _ in range(10)])
    assert run(9) == []


def test_a_link_flap_across_a_counter_reset_fires_with_its_figures_and_labels(site_a, token_a) -> None:
    # link_downed 3, then the HCA's counters reset (driver reload) to 0, then the link goes down
    # once: an increase of 1, never a negative one.
    down = [{"link_downed": 0}, {"link_downed": 0}, {"link_downed": 1}, {"link_downed": 1}]
    feed(Client(), token_a, [{}, {}, {}, *down])
    (finding,) = run(6)
    assert finding.fingerprint == f"fabric-link-flap:{site_a.name}:{HOST}:mlx5_0/1"
    assert finding.labels == {
        "site": "ams-1",
        "node": HOST,
        "interface": "mlx5_0/1",
        "fabric": "compute",
        "detector": "fabric-link-flap",
    }
    assert finding.severity == "SEV3"  # compute fabric, no gang job on the node
    assert "link downed +1" in finding.summary and finding.impact["link_downed"] == 1
    assert finding.started_at == minute(5)  # the minute the link went down
    # Steady again for the whole window: it clears.
    feed(Client(), token_a, [{"link_downed": 1}] * 12, start=7)
    assert run(18) == []


def test_a_reset_alone_is_no_flap(site_a, token_a) -> None:
    feed(Client(), token_a, [{}, {}, {"link_downed": 0}, {"link_downed": 0}])
    assert run(3) == []


def test_a_port_whose_state_leaves_active_flaps(site_a, token_a) -> None:
    feed(Client(), token_a, [{}, {}, {"state": 1}])
    (finding,) = run(2)
    assert finding.labels["interface"] == "mlx5_0/1" and "state 1 (4 is Active)" in finding.summary
    assert finding.started_at == minute(2)


@pytest.mark.parametrize(
    ("fabric_name", "severity"), [("compute", "SEV3"), ("storage", "SEV3"), ("management", "SEV4")]
)
def test_flap_severity_follows_the_fabric(site_a, token_a, fabric_name: str, severity: str) -> None:
    feed(Client(), token_a, [{}])
    NodeInterface.objects.filter(name="mlx5_0/1").update(fabric=fabric_name)
    feed(Client(), token_a, [{"link_downed": 5}], start=1)
    (finding,) = run(1)
    assert finding.severity == severity and finding.labels["fabric"] == fabric_name


def test_an_ethernet_carrier_change_is_a_management_flap(site_a, token_a) -> None:
    feed(Client(), token_a, [{"eth0": 2}, {"eth0": 2}, {"eth0": 4}])
    (finding,) = run(2)
    assert finding.labels["interface"] == "eth0" and finding.labels["fabric"] == "management"
    assert finding.severity == "SEV4" and "carrier changes +2" in finding.summary


def test_a_compute_flap_on_a_node_running_a_gang_job_is_sev2(site_a, token_a) -> None:
    from fleet.models import Job, Node

    feed(Client(), token_a, [{}, {"link_downed": 4}])
    other = Node.objects.create(site=site_a, hostname="gpu-a-018")
    job = Job.objects.create(
        site=site_a, name="llama-70b", team="foundation", gang_size=16, scheduler="kueue", scheduler_id="g1"
    )
    job.nodes.set([Node.objects.get(hostname=HOST), other])
    Job.objects.filter(pk=job.pk).update(state="running")
    (finding,) = run(1)
    assert finding.severity == "SEV2" and finding.impact["gang_node"] is True
    # One node only: not a gang.
    job.nodes.set([Node.objects.get(hostname=HOST)])
    Finding.objects.all().delete()
    (finding,) = run(1)
    assert finding.severity == "SEV3"


def test_symbol_errors_at_the_limit_are_quiet_and_past_it_degrading(site_a, token_a, settings) -> None:
    settings.FABRIC_SYMBOL_ERRORS_PER_HOUR = 60  # 10 in the 10-minute window
    # A reset in the middle: 40 -> 0 -> 4 -> 10 is +10 (the value after a reset counts from zero).
    feed(Client(), token_a, [{}, {"symbol_errors": 0}, {"symbol_errors": 4}, {"symbol_errors": 10}])
    assert run(3) == []  # 10 = 60/h: at the limit
    feed(Client(), token_a, [{"symbol_errors": 11}], start=4)
    (finding,) = run(4)
    assert finding.source == "detector:fabric-link-degrading"
    assert finding.impact["symbol_errors_per_hour"] == 66.0
    assert "symbol errors 66/h (limit 60/h)" in finding.summary and finding.severity == "SEV3"


def test_link_error_recoveries_past_the_limit_degrade(site_a, token_a, settings) -> None:
    settings.FABRIC_LINK_RECOVERIES_PER_HOUR = 6  # 1 in the window
    feed(Client(), token_a, [{}, {"link_error_recovery": 13}])
    assert run(1) == []
    feed(Client(), token_a, [{"link_error_recovery": 14}], start=2)
    (finding,) = run(2)
    assert finding.impact["link_error_recovery_per_hour"] == 12.0


def test_a_port_below_its_rated_speed_degrades(site_a, token_a) -> None:
    feed(Client(), token_a, [{}, {}, {"rate": 2.5e10}])
    (finding,) = run(2)
    assert "running at 25.0 GB/s of its rated 50.0 GB/s" in finding.summary
    assert finding.impact["rated_bytes_per_second"] == 5e10


def test_rdma_congestion_at_and_past_the_limits(site_a, token_a, settings) -> None:
    settings.FABRIC_TRANSMIT_WAIT_PER_WINDOW = 1000
    settings.FABRIC_TRANSMIT_DISCARDS_PER_WINDOW = 100
    wait = STEADY["transmit_wait"]
    # transmit wait resets to 0 then climbs to 1000 (at the limit); discards +100 (at the limit).
    feed(
        Client(),
        token_a,
        [{}, {"transmit_wait": 0, "transmit_discards": 105}, {"transmit_wait": 1000, "transmit_discards": 105}],
    )
    assert run(2) == []
    feed(Client(), token_a, [{"transmit_wait": 1001, "transmit_discards": 106}], start=3)
    (finding,) = run(3)
    assert finding.source == "detector:fabric-rdma-congestion"
    assert finding.impact == {"transmit_wait": 1001, "transmit_discards": 101}
    assert "transmit wait +1,001 (limit 1,000)" in finding.summary
    assert wait > 1001  # the reset is what kept the increase small


def test_a_port_finding_stays_while_its_port_stops_reporting(site_a, token_a) -> None:
    feed(Client(), token_a, [{}, {"link_downed": 4}])
    assert len(run(1)) == 1
    assert len(run(30)) == 1  # no data since: not judged healthy
