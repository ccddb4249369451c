"""The power read model, page, API, live pushes and overview tile: rack draw is the sum of its GPUs'
latest power plus node overhead, with samples stored through the real telemetry writer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from fleet.ingest.batches import GpuSampleIn
from fleet.models import Node, Rack, Site
from fleet.power import services as power
from fleet.telemetry.rollups import update_rollups
from fleet.telemetry.store import store_gpu_samples
from tests.conftest import make_sample

API = "/api/v1/power/"


def sample(**kw) -> GpuSampleIn:  # type: ignore[no-untyped-def]
    values = make_sample(**kw)
    values["ts"] = values["ts"] if isinstance(values["ts"], datetime) else datetime.fromisoformat(values["ts"])
    return msgspec.convert(values, GpuSampleIn, from_attributes=False, strict=False)


@pytest.fixture
def rack(site_a: Site, settings) -> Rack:  # type: ignore[no-untyped-def]
    settings.NODE_OVERHEAD_W = 2000
    rack = Rack.objects.create(site=site_a, name="r01", power_budget_kw=12)
    for host in ("p-1", "p-2", "p-3"):
        Node.objects.create(site=site_a, rack=rack, hostname=host)
    return rack


def _site(body: dict, name: str) -> dict:
    return next(s for s in body["sites"] if s["name"] == name)


def test_rack_draw_is_the_sum_of_its_gpus_latest_power_plus_node_overhead(site_a: Site, rack: Rack) -> None:
    now = datetime.now(UTC)
    old = now - timedelta(seconds=30)
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k1",
        samples=[
            sample(gpu_uuid="GPU-p1-0", hostname="p-1", gpu_index=0, ts=old, power_w=100.0),
            sample(gpu_uuid="GPU-p1-0", hostname="p-1", gpu_index=0, ts=now, power_w=650.0),  # the latest counts
            sample(gpu_uuid="GPU-p1-1", hostname="p-1", gpu_index=1, ts=now, power_w=600.0, gpu_util=2.0),
            sample(gpu_uuid="GPU-p2-0", hostname="p-2", gpu_index=0, ts=now, power_w=500.0),
            # p-3's GPU last reported ten minutes ago: not drawing as far as we know, no overhead.
            sample(gpu_uuid="GPU-p3-0", hostname="p-3", gpu_index=0, ts=now - timedelta(minutes=10), power_w=700.0),
            # A MIG instance's power is its GPU's: never added again.
            sample(
                gpu_uuid="MIG-p1-0-a", parent_uuid="GPU-p1-0", hostname="p-1", ts=now, power_w=650.0, mig_profile="1g"
            ),
        ],
    )
    snap = power.snapshot()
    site = _site(snap, "ams-1")
    (r,) = site["racks"]
    assert r["draw_kw"] == pytest.approx((650 + 600 + 500 + 2 * 2000) / 1000)
    assert r["budget_kw"] == 12.0
    assert r["headroom_kw"] == pytest.approx(12 - 5.75)
    assert r["utilisation_pct"] == pytest.approx(round(100 * 5.75 / 12, 1))
    assert (r["gpus"], r["reporting"], r["idle_gpus"]) == (4, 3, 1)
    assert site["draw_kw"] == pytest.approx(5.75)
    assert site["contracted_kw"] == 500.0 and site["headroom_kw"] == pytest.approx(500 - 5.75)


def test_gpus_beyond_what_the_budget_energises_count_as_unpowered(site_a: Site, rack: Rack) -> None:
    now = datetime.now(UTC)
    # Three nodes of two H100s: 2 x 700 + 2000 = 3.4 kW each at full load; a 7 kW budget runs two.
    Rack.objects.filter(pk=rack.pk).update(power_budget_kw=7)
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k2",
        samples=[
            sample(gpu_uuid=f"GPU-{h}-{i}", hostname=h, gpu_index=i, ts=now, power_w=300.0)
            for h in ("p-1", "p-2", "p-3")
            for i in (0, 1)
        ],
    )
    r = _site(power.snapshot(), "ams-1")["racks"][0]
    assert (r["nodes"], r["nodes_energisable"], r["unpowered_gpus"]) == (3, 2, 2)
    Rack.objects.filter(pk=rack.pk).update(power_budget_kw=11)
    r = _site(power.snapshot(), "ams-1")["racks"][0]
    assert (r["nodes_energisable"], r["unpowered_gpus"]) == (3, 0)


def test_energy_over_24h_and_7d_comes_from_the_hourly_rollups(site_a: Site, rack: Rack) -> None:
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k3",
        samples=[
            sample(gpu_uuid="GPU-e", hostname="p-1", ts=start + timedelta(minutes=m), power_w=600.0) for m in range(3)
        ],
    )
    update_rollups()
    update_rollups(now=datetime.now(UTC) + timedelta(hours=2))  # settle the hour
    site = _site(power.snapshot(), "ams-1")
    # Three minutes at 600 W: 3 x 600 x 60 J = 0.03 kWh, rounded to 0.0; check the raw sum instead.
    assert site["racks"][0]["energy_kwh_7d"] == site["racks"][0]["energy_kwh_24h"] == site["energy_kwh_24h"]
    energy = power._energy_kwh(datetime.now(UTC))
    assert ("rack", rack.pk) in energy and ("site", site_a.pk) in energy


def test_the_minute_series_adds_the_overhead_of_the_nodes_reporting_each_minute(site_a: Site, rack: Rack) -> None:
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k4",
        samples=[
            sample(gpu_uuid="GPU-s1", hostname="p-1", ts=minute + timedelta(seconds=5), power_w=400.0),
            sample(gpu_uuid="GPU-s2", hostname="p-2", ts=minute + timedelta(seconds=5), power_w=300.0),
        ],
    )
    update_rollups()
    series = power.minute_series()
    rack_series = series["racks"][str(rack.pk)]
    assert rack_series["ts"] == [minute.isoformat()]
    assert rack_series["draw_kw"] == [pytest.approx((400 + 300 + 2 * 2000) / 1000)]
    assert series["sites"][str(site_a.pk)]["draw_kw"] == rack_series["draw_kw"]


def test_the_power_page_renders_for_a_viewer_and_refuses_a_user_without_a_role(
    viewer_client, norole_client, anon_client, rack
) -> None:  # type: ignore[no-untyped-def]
    response = viewer_client.get("/power/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="power-sites"' in html and "js/power.js" in html and "style=" not in html
    assert norole_client.get("/power/").status_code == 403
    assert anon_client.get("/power/").status_code == 302


def test_the_api_gives_each_site_and_rack_its_figures(viewer_client, anon_client, site_a, rack) -> None:  # type: ignore[no-untyped-def]
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k5",
        samples=[sample(gpu_uuid="GPU-a", hostname="p-1", ts=datetime.now(UTC), power_w=500.0)],
    )
    body = viewer_client.get(API).json()
    assert set(body) >= {"ts", "sites", "series", "node_overhead_w"}
    site = _site(body, "ams-1")
    assert set(site) >= {
        "draw_kw",
        "contracted_kw",
        "headroom_kw",
        "utilisation_pct",
        "idle_gpus",
        "unpowered_gpus",
        "energy_kwh_24h",
        "energy_kwh_7d",
        "racks",
    }
    assert site["racks"][0]["draw_kw"] == pytest.approx(2.5)
    assert anon_client.get(API).status_code in (401, 403)


def test_a_live_push_carries_only_what_changed(site_a, rack) -> None:  # type: ignore[no-untyped-def]
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k6",
        samples=[sample(gpu_uuid="GPU-l", hostname="p-1", ts=datetime.now(UTC), power_w=500.0)],
    )
    first, watermark = power.build_power_delta("power", None)
    assert first is not None and first["type"] == "power.delta"
    assert _site(first, "ams-1")["racks"][0]["draw_kw"] == pytest.approx(2.5)
    again, watermark = power.build_power_delta("power", watermark)
    assert again is None  # nothing moved: nothing sent
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k7",
        samples=[sample(gpu_uuid="GPU-l", hostname="p-1", ts=datetime.now(UTC), power_w=900.0)],
    )
    moved, _ = power.build_power_delta("power", watermark)
    assert moved is not None and _site(moved, "ams-1")["racks"][0]["draw_kw"] == pytest.approx(2.9)


def test_the_overview_tile_names_a_rack_near_its_budget(viewer_client, site_a, rack) -> None:  # type: ignore[no-untyped-def]
    Rack.objects.filter(pk=rack.pk).update(power_budget_kw=3)
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k8",
        samples=[sample(gpu_uuid="GPU-t", hostname="p-1", ts=datetime.now(UTC), power_w=950.0)],
    )
    html = viewer_client.get("/").content.decode()
    assert 'id="power-tile"' in html
    assert "ams-1/r01 98 %" in html
