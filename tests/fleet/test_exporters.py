"""The exporter mapping table (fleet.exporters): one entry per exporter, from its room's
mappings.py, and the Prometheus door reads whatever the table holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleet import exporters
from fleet.fabric.store import port_part
from fleet.ingest.prometheus import parse_exposition
from fleet.telemetry.series import NodeSeries

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real table, as registered at start-up, that a test may add to and leaves as it was."""
    monkeypatch.setattr(exporters, "_exact", dict(exporters._exact))
    monkeypatch.setattr(exporters, "_prefixed", list(exporters._prefixed))


def test_each_room_contributes_its_own_entries_from_its_mappings_module() -> None:
    exported = {m.exporter for m, _ in exporters._exact.values()}
    modules = {m.store.__module__ for m, _ in exporters._exact.values()} | {
        m.store.__module__ for m in exporters._prefixed
    }
    assert modules == {
        "fleet.telemetry.store",
        "fleet.serving.store",
        "fleet.fabric.store",
        "fleet.storage.store",
        "fleet.scheduler.store",
        "compliance.services.velero",
    }
    assert {"dcgm-exporter", "kueue, kube-state-metrics, slurm"} <= exported
    assert exporters.lookup("DCGM_FI_DEV_GPU_UTIL")[1] == "gpu_util"  # type: ignore[index]
    assert exporters.lookup("vllm:num_requests_running")[0].reads == exporters.SERVING  # type: ignore[index]
    assert exporters.lookup("velero_backup_success_total")[0].reads == exporters.PUSH  # type: ignore[index]
    assert exporters.lookup("go_goroutines") is None


@pytest.mark.usefixtures("table")
def test_a_new_entry_is_read_by_the_door_with_nothing_else_changed() -> None:
    text = 'node_infiniband_port_probe_total{device="mlx5_0",port="1",hostname="gpu-node-1"} 7\n'
    assert exporters.lookup("node_infiniband_port_probe_total") is None  # ignored and counted until now
    exporters.register_mappings(
        exporters.ExporterMapping(
            "probe",
            exporters.NODE,
            port_part,
            families={"node_infiniband_port_probe_total": NodeSeries("infiniband", "probe", True)},
            kinds=("auto", "node"),
        )
    )
    exposition = parse_exposition(text, now=NOW)
    assert exposition.ignored == 0
    assert [(p.hostname, p.quantity, p.device, p.port, p.value) for p in exposition.node] == [
        ("gpu-node-1", "probe", "mlx5_0", "1", 7.0)
    ]


@pytest.mark.usefixtures("table")
def test_a_family_claimed_by_two_entries_is_refused() -> None:
    twice = exporters.ExporterMapping(
        "again",
        exporters.NODE,
        port_part,
        families={"node_network_receive_bytes_total": NodeSeries("netdev", "x", True)},
    )
    with pytest.raises(ValueError, match="node_network_receive_bytes_total is mapped twice"):
        exporters.register_mappings(twice)
