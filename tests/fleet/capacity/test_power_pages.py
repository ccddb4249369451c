"""The power read model, page, API, live pushes and overview tile: rack draw is the sum of its GPUs'
latest power plus node overhead, with samples stored through the real telemetry writer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from fleet.ingest.batches import GpuSampleIn
from fleet.models import Node, Rack, Site
from fleet.power import read as power
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
    # What the draw includes, in parts: the GPUs, and the assumed overhead of the two reporting nodes.
    assert (r["gpu_draw_kw"], r["node_overhead_kw"]) == (pytest.approx(1.75), pytest.approx(4.0))
    assert site["draw_kw"] == pytest.approx(5.75)
    assert snap["node_overhead_w"] == 2000 and snap["node_overhead_measured"] is False
    # The site's one rack has 12 - 5.75 kW left: that, not 500 - 5.75, is what the site can add.
    assert site["contracted_kw"] == 500.0 and site["headroom_kw"] == pytest.approx(12 - 5.75)
    assert site["headroom_limited_by"] == "racks"


def test_site_headroom_is_what_its_rack_budgets_allow_within_the_contract(site_a: Site, rack: Rack) -> None:
    """The issue's case: contracted minus drawn said 397.6 kW where the racks allowed about 86 kW more."""
    now = datetime.now(UTC)
    hot = Rack.objects.create(site=site_a, name="r02", power_budget_kw=4)
    Node.objects.create(site=site_a, rack=hot, hostname="q-1")
    Rack.objects.create(site=site_a, name="r03", power_budget_kw=80)  # empty: 80 kW of room for new nodes
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="h1",
        samples=[
            sample(gpu_uuid="GPU-h-p1", hostname="p-1", ts=now, power_w=1000.0),  # r01: 3 kW of 12
            sample(gpu_uuid="GPU-h-q1", hostname="q-1", ts=now, power_w=3000.0),  # r02: 5 kW of 4, over
        ],
    )
    site = _site(power.snapshot(), "ams-1")
    racks = {r["name"]: r for r in site["racks"]}
    assert racks["r02"]["headroom_kw"] == pytest.approx(-1.0)
    # r01's 9 kW and r03's 80 kW; the rack over budget gives none (and takes none from the others).
    assert site["rack_headroom_kw"] == pytest.approx(9 + 80)
    assert site["headroom_kw"] == pytest.approx(89.0) and site["headroom_limited_by"] == "racks"
    Site.objects.filter(pk=site_a.pk).update(contracted_power_kw=50)
    site = _site(power.snapshot(), "ams-1")
    assert site["headroom_kw"] == pytest.approx(50 - 8.0) and site["headroom_limited_by"] == "contract"


def test_a_node_in_no_rack_or_an_unbudgeted_rack_leaves_the_contract_as_the_only_bound(
    site_a: Site, rack: Rack
) -> None:
    now = datetime.now(UTC)
    Node.objects.create(site=site_a, rack=None, hostname="loose-1")
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="u1",
        samples=[sample(gpu_uuid="GPU-u-1", hostname="loose-1", ts=now, power_w=1000.0)],
    )
    site = _site(power.snapshot(), "ams-1")
    assert site["rack_headroom_kw"] is None
    assert site["headroom_kw"] == pytest.approx(500 - 3.0) and site["headroom_limited_by"] == "contract"


def test_gpus_beyond_what_the_budget_energises_are_beyond_the_power_budget(site_a: Site, rack: Rack) -> None:
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
    assert (r["nodes"], r["nodes_energisable"], r["beyond_budget_gpus"]) == (3, 2, 2)
    Rack.objects.filter(pk=rack.pk).update(power_budget_kw=11)
    r = _site(power.snapshot(), "ams-1")["racks"][0]
    assert (r["nodes_energisable"], r["beyond_budget_gpus"]) == (3, 0)


def test_a_silent_gpu_is_not_beyond_the_budget(site_a: Site, rack: Rack) -> None:
    # Three nodes of two H100s in a 12 kW rack: 3 x 3.4 kW at full load fits. p-3 stopped reporting.
    now = datetime.now(UTC)
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="s2",
        samples=[
            sample(
                gpu_uuid=f"GPU-{h}-{i}", hostname=h, gpu_index=i, ts=now - timedelta(minutes=10 if h == "p-3" else 0)
            )
            for h in ("p-1", "p-2", "p-3")
            for i in (0, 1)
        ],
    )
    site = _site(power.snapshot(), "ams-1")
    assert (site["beyond_budget_gpus"], site["reporting"], site["gpus"]) == (0, 4, 6)


def test_gpus_beyond_the_budget_agree_with_capacitys_energised_supply(site_a: Site, rack: Rack) -> None:
    """One rule for both pages: the capacity tile's installed less energised is the power tile's
    GPUs beyond the budget (a contract that binds nothing here)."""
    from fleet.capacity.read.supply import pool_figures
    from fleet.models import Pool

    now = datetime.now(UTC)
    Rack.objects.filter(pk=rack.pk).update(power_budget_kw=6.9)
    # p-1 and p-3: two H100s each (3.4 kW at full load); p-2 four A100s (3.6 kW). In hostname
    # order the 6.9 kW budget runs p-1, has 3.5 kW left, which p-2 does not fit and p-3 does.
    samples = [sample(gpu_uuid=f"GPU-{h}-{i}", hostname=h, gpu_index=i, ts=now) for h in ("p-1", "p-3") for i in (0, 1)]
    samples += [
        sample(gpu_uuid=f"GPU-p-2-{i}", hostname="p-2", gpu_index=i, ts=now, model="NVIDIA A100-SXM4-80GB")
        for i in range(4)
    ]
    store_gpu_samples(site_id=site_a.pk, batch_key="c1", samples=samples)
    pools = [
        Pool.objects.create(site=site_a, gpu_model="NVIDIA H100 80GB HBM3", name="h100"),
        Pool.objects.create(site=site_a, gpu_model="NVIDIA A100-SXM4-80GB", name="a100"),
    ]
    figures = pool_figures(pools).values()
    site = _site(power.snapshot(), "ams-1")
    assert site["beyond_budget_gpus"] == sum(f.installed - f.energised for f in figures) == 4


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
        "beyond_budget_gpus",
        "gpu_draw_kw",
        "node_overhead_kw",
        "headroom_limited_by",
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


def test_every_draw_figure_on_the_overview_says_what_it_includes(viewer_client, site_a, rack) -> None:  # type: ignore[no-untyped-def]
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="k9",
        samples=[
            sample(gpu_uuid="GPU-o1", hostname="p-1", ts=datetime.now(UTC), power_w=700.0),
            sample(gpu_uuid="GPU-o2", hostname="p-2", ts=datetime.now(UTC), power_w=300.0),
        ],
    )
    html = viewer_client.get("/").content.decode()
    # The fleet section's figure is the GPUs alone; the power section's adds the nodes, in parts.
    assert 'GPU power draw</div><div class="stat-value">1.0<small> kW' in html
    assert "GPUs only, no node overhead" in html
    assert 'Draw, GPUs and nodes</div><div class="stat-value">5.0<small> kW of 500' in html
    assert "GPUs 1.0 kW + node overhead 4.0 kW (assumed: 2000 W a node, not measured)" in html
    assert "GPUs beyond the power budget" in html and "Unpowered" not in html


def test_the_gpu_draw_of_the_power_page_is_the_fleet_pages_gpu_power(viewer_client, site_a, site_b, rack) -> None:  # type: ignore[no-untyped-def]
    """One number, one definition: fleet.telemetry.read.figures.gpu_power_w feeds both."""
    now = datetime.now(UTC)
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="g1",
        samples=[
            sample(gpu_uuid="GPU-g1", hostname="p-1", ts=now, power_w=640.5),
            sample(gpu_uuid="GPU-g2", hostname="p-2", ts=now - timedelta(minutes=10), power_w=999.0),  # stale
            sample(gpu_uuid="MIG-g1-a", parent_uuid="GPU-g1", hostname="p-1", ts=now, power_w=640.5, mig_profile="1g"),
            sample(gpu_uuid="GPU-g3", hostname="loose-a", ts=now, power_w=210.25),  # in no rack
        ],
    )
    store_gpu_samples(
        site_id=site_b.pk, batch_key="g2", samples=[sample(gpu_uuid="GPU-g4", hostname="b-1", ts=now, power_w=333.0)]
    )
    fleet = viewer_client.get("/api/v1/fleet/overview/").json()
    snap = viewer_client.get(API).json()
    for card in fleet["sites"]:
        assert _site(snap, card["name"])["gpu_draw_kw"] == pytest.approx(card["power_kw"])
    assert sum(s["gpu_draw_kw"] for s in snap["sites"]) == pytest.approx(fleet["totals"]["power_kw"])
    assert fleet["totals"]["power_kw"] == pytest.approx((640.5 + 210.25 + 333.0) / 1000, abs=0.01)
