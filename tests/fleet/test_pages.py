"""Server-rendered fleet pages: the dashboard shell, a GPU and a node, and the overview."""

from __future__ import annotations

from fleet.models import Gpu
from tests.conftest import make_sample, post_batch


def test_gpu_and_node_pages_show_latest_state(viewer_client, client, token_a) -> None:
    sample = make_sample(hostname="gpu-a-123", gpu_index=5, xid=79, power_w=432.1)
    assert post_batch(client, token_a, {"samples": [sample]}).status_code == 202
    gpu = Gpu.objects.get(uuid=sample["gpu_uuid"])
    page = viewer_client.get(gpu.get_absolute_url()).content.decode()
    assert "gpu-a-123 · GPU 5" in page and "432.1" in page and "DCGM_FI_DEV_XID_ERRORS" in page
    node_page = viewer_client.get(gpu.node.get_absolute_url()).content.decode()
    assert sample["gpu_uuid"] in node_page and "bad-text" in node_page  # the XID is flagged
    assert viewer_client.get("/fleet/gpus/GPU-does-not-exist/").status_code == 404


def test_the_dashboard_loads_plotly_from_our_own_static_files(viewer_client) -> None:
    from django.templatetags.static import static

    page = viewer_client.get("/fleet/").content.decode()
    plotly = static("vendor/plotly.min.js")  # content-hashed (tests/console/test_static_files.py)
    assert f'<script src="{plotly}">' in page
    assert "cdn" not in page.lower()
    asset = viewer_client.get(plotly)
    assert asset.status_code == 200
    assert b"plotly" in b"".join(asset.streaming_content)[:2000].lower()


def test_the_overview_shows_fleet_totals(viewer_client, client, token_a) -> None:
    post_batch(client, token_a, {"samples": [make_sample(power_w=700.0), make_sample(power_w=300.0)]})
    page = viewer_client.get("/").content.decode()
    assert "Live fleet dashboard" in page and "1.0<small> kW" in page and "ams-1" in page


def _errors_everywhere(viewer_client) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The "GPUs with XID / ECC errors" figure wherever it is shown: the overview's total and site
    cards (HTML), the fleet page's totals, site cards and GPU rows (its snapshot API)."""
    import re

    html = viewer_client.get("/").content.decode()
    total = re.search(r'id="overview-errors".*?class="stat-value">(\d+)<', html, re.S)
    cards = dict(re.findall(r'data-site-errors="([^"]+)">(\d+)<', html))
    fleet = viewer_client.get("/api/v1/fleet/overview/").json()
    return {
        "overview": int(total.group(1)) if total else None,
        "overview_sites": {name: int(n) for name, n in cards.items()},
        "fleet": fleet["totals"]["with_errors"],
        "fleet_sites": {s["name"]: s["with_errors"] for s in fleet["sites"]},
        "fleet_rows": sorted(g["uuid"] for g in fleet["gpus"] if g["open_xid_ecc"]),
        "fleet_failed": fleet["totals"]["failed"],
        "fleet_sites_failed": {s["name"]: s["failed"] for s in fleet["sites"]},
        "table_errors": sorted(
            g["uuid"] for g in viewer_client.get("/api/v1/fleet/gpu-table/", {"state": "errors"}).json()["gpus"]
        ),
    }


def test_gpus_with_xid_or_ecc_errors_count_open_findings_not_the_latest_sample(
    viewer_client, admin_user, client, token_a, token_b
) -> None:
    """A GPU keeps counting while its XID or ECC finding is open, though its next sample reads 0;
    the overview and the fleet page give the same figure, computed by one function."""
    from datetime import UTC, datetime, timedelta

    from fleet.telemetry.read import figures
    from incidents.detectors import registered, run_detectors
    from incidents.models import Incident
    from incidents.services.engine import Actor, resolve_incident

    now = datetime.now(UTC)
    xid, dbe, benign = "GPU-5a5a0000-0079", "GPU-5a5a0000-0048", "GPU-5a5a0000-0013"
    post_batch(
        client,
        token_a,
        {
            "samples": [
                make_sample(
                    gpu_uuid=xid,
                    hostname="gpu-a-500",
                    gpu_index=0,
                    xid=79,
                    ts=(now - timedelta(seconds=20)).isoformat(),
                ),
                make_sample(gpu_uuid=benign, hostname="gpu-a-500", gpu_index=1, xid=13, ts=now.isoformat()),
            ]
        },
    )
    post_batch(client, token_b, {"samples": [make_sample(gpu_uuid=dbe, hostname="gpu-b-500", ecc_dbe_total=2)]})
    run_detectors(only=list(figures.XID_ECC_DETECTORS))
    assert set(figures.XID_ECC_DETECTORS) <= set(registered())  # a renamed detector fails here
    # The XID was one sample's value: the GPU's next sample reads 0, and the finding clears.
    post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=xid, hostname="gpu-a-500", gpu_index=0, xid=0)]})
    run_detectors(only=["critical-xid", "ecc-double-bit"])

    seen = _errors_everywhere(viewer_client)
    assert seen == {
        "overview": 2,
        "overview_sites": {"ams-1": 1, "iad-2": 1},
        "fleet": 2,
        "fleet_sites": {"ams-1": 1, "iad-2": 1},
        "fleet_rows": sorted([xid, dbe]),  # XID 13 (benign) opens nothing and counts nowhere
        "fleet_failed": 2,  # a failed GPU is one with an open XID / ECC finding (fleet.telemetry.read.gpu_list)
        "fleet_sites_failed": {"ams-1": 1, "iad-2": 1},
        "table_errors": sorted([xid, dbe]),
    }
    # Once its incident is resolved the XID GPU stops counting, everywhere at once.
    xid_incident = Incident.objects.get(labels__gpu=xid)
    resolve_incident(xid_incident, actor=Actor.person(admin_user), note="node drained and reset")
    seen = _errors_everywhere(viewer_client)
    assert (seen["overview"], seen["fleet"], seen["overview_sites"], seen["fleet_rows"]) == (
        1,
        1,
        {"ams-1": 0, "iad-2": 1},
        [dbe],
    )
