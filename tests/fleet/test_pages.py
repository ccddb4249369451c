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
