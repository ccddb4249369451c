"""Real exporters as they are in the field, pushed to the Prometheus door: MIG, Triton's GPU series,
older dcgm-exporter releases, repeated pushes, and values or timestamps that would break the store.

The fixtures under tests/fixtures/ are written from the exporters' own documentation (the
dcgm-exporter counter lists and MIG output, Triton's and vLLM's metrics pages, TGI's).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from fleet.ingest.prometheus import parse_exposition, store_exposition
from fleet.models import Endpoint, Gpu, GpuRollup1m, GpuSample, GroupRollup1m, IngestBatch, Node, ServingSample
from fleet.telemetry import partitions, rollups
from fleet.telemetry.detectors import double_bit_ecc, thermal_throttling
from fleet.telemetry.fields import GPU_SAMPLE_FIELDS as GPU_FIELDS
from fleet.telemetry.read import figures
from tests.fleet.telemetry.test_prometheus_ingest import DCGM, GPU0, GPU1, VLLM, push

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MIG = (FIXTURES / "dcgm-exporter-mig.prom").read_text()
TRITON = (FIXTURES / "triton.prom").read_text()
OLD = (FIXTURES / "dcgm-exporter-old.prom").read_text()
OLD_LATER = (FIXTURES / "dcgm-exporter-old-later.prom").read_text()
VLLM_OLD = (FIXTURES / "vllm-old.prom").read_text()
TGI = (FIXTURES / "tgi.prom").read_text()
MIG_GPU = "GPU-5c1e0b7a-2d3f-4e9a-8b1c-0d2e3f4a5b6c"
WHOLE_GPU = "GPU-9a8b7c6d-5e4f-4a3b-9c2d-1e0f2a3b4c5d"
OLD_HOT = "GPU-1b2c3d4e-5f60-4718-92a3-b4c5d6e7f809"
OLD_DBE = "GPU-2c3d4e5f-6071-4829-a3b4-c5d6e7f8091a"


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.split("\n"), start=1) if needle in line)


def with_timestamps(text: str, ms: int) -> str:
    """The exposition with a timestamp on every sample line."""
    return "".join(f"{line} {ms}\n" if line and not line.startswith("#") else f"{line}\n" for line in text.split("\n"))


def nothing_stored() -> bool:
    return not (GpuSample.objects.exists() or ServingSample.objects.exists() or IngestBatch.objects.exists())


# --- 1. MIG ------------------------------------------------------------------------------------


def test_mig_instances_appear_under_their_physical_gpu_with_profile_utilisation_and_memory(client, token_a) -> None:
    response = push(client, token_a, MIG)
    assert response.status_code == 202, response.content
    physical = Gpu.objects.get(uuid=MIG_GPU)
    instances = {g.mig_instance_id: g for g in Gpu.objects.filter(parent=physical).select_related("state")}
    assert {i: g.mig_profile for i, g in instances.items()} == {1: "3g.40gb", 5: "2g.20gb", 13: "1g.10gb"}
    two_g = instances[5]
    assert two_g.index == 0 and two_g.uuid.startswith("MIG-") and "gpu0 · MIG 2g.20gb #5" in str(two_g)
    # Their own utilisation (graphics-engine activity, as DCGM has no GPU_UTIL on MIG) and memory.
    assert two_g.state.gpu_util == pytest.approx(65.51, abs=0.01)
    assert (two_g.state.fb_used_mib, two_g.state.fb_free_mib) == (14210, 5886)
    assert two_g.state.sm_active == pytest.approx(0.601288, rel=1e-5)
    # Power, temperature, clocks and ECC are the physical GPU's only.
    assert two_g.state.power_w is None and two_g.state.gpu_temp_c is None and two_g.state.sm_clock_mhz is None
    assert physical.state.power_w == pytest.approx(421.874, rel=1e-6) and physical.state.gpu_temp_c == 56
    assert len({str(g) for g in instances.values()}) == 3  # not three "gpu0"


def test_a_mig_gpu_counts_once_in_every_total(client, viewer_client, token_a) -> None:
    assert push(client, token_a, MIG).status_code == 202
    totals = figures.fleet_totals()
    assert totals["gpus"] == 2 and totals["reporting"] == 2
    assert totals["power_kw"] == pytest.approx((421.874 + 648.215) / 1000, abs=0.01)
    assert figures.site_summaries()[0]["gpus"] == 2
    assert {row["uuid"] for row in figures.gpu_rows()} == {MIG_GPU, WHOLE_GPU}
    node = viewer_client.get("/api/v1/fleet/nodes/gpu-mig-001/")
    assert node.status_code == 200 and node.json()["gpu_count"] == 2
    rollups.update_rollups()
    node_id = Node.objects.get(hostname="gpu-mig-001").pk
    group = GroupRollup1m.objects.get(scope="node", scope_id=node_id)
    assert group.gpus == 2 and group.power_sum == pytest.approx(421.874 + 648.215, rel=1e-4)
    assert GpuRollup1m.objects.filter(gpu__parent__isnull=False).count() == 3  # instances keep their own


def test_the_gpu_api_shows_the_parent_the_profile_and_the_instances(client, admin_client, token_a) -> None:
    assert push(client, token_a, MIG).status_code == 202
    parent = admin_client.get(f"/api/v1/fleet/gpus/{MIG_GPU}/").json()
    assert parent["parent"] is None and len(parent["mig_instances"]) == 3
    instance_uuid = next(i["uuid"] for i in parent["mig_instances"] if i["mig_profile"] == "1g.10gb")
    instance = admin_client.get(f"/api/v1/fleet/gpus/{instance_uuid}/").json()
    assert (instance["parent"], instance["mig_profile"], instance["mig_instance_id"]) == (MIG_GPU, "1g.10gb", 13)
    physical_only = admin_client.get("/api/v1/fleet/gpus/?physical=true").json()["results"]
    assert {g["uuid"] for g in physical_only} == {MIG_GPU, WHOLE_GPU}
    page = admin_client.get(f"/fleet/gpus/{MIG_GPU}/")
    assert page.status_code == 200 and b"MIG instances" in page.content and b"2g.20gb" in page.content


def test_device_fields_repeated_on_instance_lines_belong_to_the_physical_gpu(client, token_a) -> None:
    """Some exporter set-ups repeat device-level fields on each instance entity."""
    labels = f'gpu="0",UUID="{MIG_GPU}",modelName="NVIDIA H100 80GB HBM3",hostname="gpu-mig-002"'
    body = "".join(
        f'DCGM_FI_DEV_POWER_USAGE{{{labels},GPU_I_PROFILE="{p}",GPU_I_ID="{i}"}} 300\n'
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels},GPU_I_PROFILE="{p}",GPU_I_ID="{i}"}} 0.5\n'
        for i, p in ((1, "3g.40gb"), (2, "3g.40gb"))
    )
    assert push(client, token_a, body).status_code == 202
    physical = Gpu.objects.get(uuid=MIG_GPU)
    assert physical.state.power_w == 300
    assert all(g.state.power_w is None for g in physical.mig_instances.all())
    assert figures.fleet_totals()["power_kw"] == pytest.approx(0.3)


def test_a_json_batch_may_not_give_a_mig_instance_power_of_its_own(client, token_a) -> None:
    from tests.conftest import make_sample, post_batch

    parent = make_sample(gpu_uuid=MIG_GPU, hostname="gpu-mig-003")
    instance = make_sample(gpu_uuid=f"MIG-{MIG_GPU[4:]}-gi1", hostname="gpu-mig-003", parent_uuid=MIG_GPU)
    response = post_batch(client, token_a, {"samples": [parent, instance]})
    assert response.status_code == 400 and response.json()["item"] == 1, response.content
    assert nothing_stored()


def test_a_mig_instance_needs_its_physical_gpu_registered_or_in_the_batch(client, token_a) -> None:
    from tests.conftest import make_sample, post_batch

    instance = {
        k: v
        for k, v in make_sample(gpu_uuid=f"MIG-{MIG_GPU[4:]}-gi1", hostname="gpu-mig-004", parent_uuid=MIG_GPU).items()
        if k in ("gpu_uuid", "hostname", "ts", "parent_uuid", "gpu_util", "fb_used_mib")
    }
    response = post_batch(client, token_a, {"samples": [instance]})
    assert response.status_code == 400 and response.json()["field"] == "parent_uuid", response.content
    assert nothing_stored()
    parent = make_sample(gpu_uuid=MIG_GPU, hostname="gpu-mig-004")
    assert post_batch(client, token_a, {"samples": [parent, instance]}).status_code == 202
    assert Gpu.objects.get(uuid=instance["gpu_uuid"]).parent.uuid == MIG_GPU


def test_a_mig_instance_of_another_sites_gpu_is_held_back_as_a_claim(client, token_a, site_b) -> None:
    from console.models import AgentToken
    from tests.conftest import make_sample, post_batch

    token_b = AgentToken.issue(site=site_b, name="agent-b")[1]
    assert (
        post_batch(client, token_b, {"samples": [make_sample(gpu_uuid=MIG_GPU, hostname="gpu-b-001")]}).status_code
        == 202
    )
    instance = make_sample(gpu_uuid=f"MIG-{MIG_GPU[4:]}-gi7", hostname="gpu-a-050", parent_uuid=MIG_GPU)
    instance = {k: v for k, v in instance.items() if k in ("gpu_uuid", "hostname", "ts", "parent_uuid", "gpu_util")}
    response = post_batch(client, token_a, {"samples": [instance]})
    assert response.status_code == 409 and response.json()["field"] == "parent_uuid", response.content
    assert not Gpu.objects.filter(parent__uuid=MIG_GPU).exists()


# --- 2. Triton -----------------------------------------------------------------------------------


def test_a_stock_triton_scrape_gives_one_endpoint_per_model_and_ignores_its_gpu_series(client, token_a) -> None:
    response = push(client, token_a, TRITON)
    assert response.status_code == 202, response.content
    body = response.json()
    endpoints = {e.name: e for e in Endpoint.objects.all()}
    assert set(endpoints) == {"resnet50", "bert_large"}
    assert (endpoints["resnet50"].version, endpoints["bert_large"].version) == ("1", "3")
    assert {e.framework for e in endpoints.values()} == {"triton"}
    assert body["ignored_metrics"]["nv_gpu_utilization"] == 2 and body["ignored_metrics"]["nv_cpu_utilization"] == 1
    assert not Gpu.objects.exists()  # Triton's GPU series do not make GPUs beside dcgm-exporter's
    bert = ServingSample.objects.filter(endpoint=endpoints["bert_large"], metric="nv_inference_request_success")
    assert {r.series: r.value for r in bert} == {'version="2"': 20114, 'version="3"': 611905}
    assert body["serving_samples"] == ServingSample.objects.count()


def test_a_scrape_target_on_a_plain_triton_server_is_up(site_a, settings) -> None:
    from fleet.models import ScrapeTarget
    from fleet.tasks import scrape_target
    from tests.fleet.telemetry.test_scrape_targets import Exporter

    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the stand-in Triton runs on loopback
    server = Exporter()
    try:
        target = ScrapeTarget.objects.create(site=site_a, name="triton", url=server.url("/triton"), kind="triton")
        scrape_target(target.pk)
    finally:
        server.server.shutdown()
        server.server.server_close()
    target.refresh_from_db()
    assert target.health == "up", target.last_error
    assert Endpoint.objects.filter(site=site_a).count() == 2


# --- 3. Older dcgm-exporter releases --------------------------------------------------------------


def test_throttling_is_read_from_violation_counters_when_no_bitmask_is_exported(site_a) -> None:
    # Two scrapes 30 s apart in one minute (the minute rollup compares a minute's own samples).
    # (the previous minute: both in the past, and the newest within the staleness window).
    start = timezone.now().replace(second=5, microsecond=0) - timedelta(minutes=1)
    for body, at in ((OLD, start), (OLD_LATER, start + timedelta(seconds=30))):
        exposition = parse_exposition(body, now=at)
        store_exposition(exposition, site_id=site_a.pk, batch_key=f"old-{at.isoformat()}")
    hot = Gpu.objects.get(uuid=OLD_HOT)
    assert hot.state.throttle_reasons is None and hot.state.thermal_violation_us == 77724382
    found = {f.fingerprint for f in thermal_throttling(timezone.now())}
    assert found == {f"thermal:{OLD_HOT}"}
    rollups.update_rollups()
    minutes = GpuRollup1m.objects.filter(gpu=hot)
    assert sum(m.throttled_samples for m in minutes) >= 1
    assert not any(m.throttled_samples for m in GpuRollup1m.objects.filter(gpu__uuid=OLD_DBE))


def test_a_double_bit_ecc_count_above_zero_is_a_finding_on_first_sight(site_a) -> None:
    exposition = parse_exposition(OLD, now=timezone.now())
    store_exposition(exposition, site_id=site_a.pk, batch_key="old-first-sight")
    assert Gpu.objects.get(uuid=OLD_DBE).state.ecc_dbe_total == 2
    assert {f.fingerprint for f in double_bit_ecc(timezone.now())} == {f"ecc-dbe:{OLD_DBE}"}


def test_older_vllm_names_and_tgi_are_stored_as_exposed(client, token_a) -> None:
    assert push(client, token_a, VLLM_OLD).status_code == 202
    assert ServingSample.objects.filter(metric="vllm:gpu_cache_usage_perc").exists()
    assert ServingSample.objects.filter(metric="vllm:time_per_output_token_seconds_bucket").count() > 10
    refused = push(client, token_a, TGI)
    assert refused.status_code == 400 and refused.json()["field"] == "endpoint"
    assert push(client, token_a, TGI, "?endpoint=tgi-mistral").status_code == 202
    tgi = Endpoint.objects.get(name="tgi-mistral")
    assert tgi.framework == "tgi" and ServingSample.objects.filter(endpoint=tgi, metric="tgi_queue_size").exists()


# --- 4. Repeated pushes ---------------------------------------------------------------------------


def test_a_plain_repeated_push_is_a_new_observation(client, token_a) -> None:
    for _ in range(3):
        assert push(client, token_a, DCGM).status_code == 202
    assert GpuSample.objects.filter(gpu__uuid=GPU0).count() == 3
    assert len(set(GpuSample.objects.filter(gpu__uuid=GPU0).values_list("ts", flat=True))) == 3


def test_a_repeat_is_deduplicated_by_its_key_or_by_its_own_timestamps(client, token_a) -> None:
    for _ in range(2):
        assert push(client, token_a, DCGM, **{"Idempotency-Key": "cron-17"}).status_code == 202
    assert GpuSample.objects.filter(gpu__uuid=GPU0).count() == 1
    ms = int(timezone.now().timestamp() * 1000)
    stamped = "".join(
        f"{line} {ms}\n" if line and not line.startswith("#") else f"{line}\n" for line in DCGM.split("\n")
    )
    for _ in range(2):
        assert push(client, token_a, stamped).status_code == 202
    assert GpuSample.objects.filter(gpu__uuid=GPU0).count() == 2


# --- 5. Values that break the parser or the store ----------------------------------------------


def test_non_finite_values_are_no_value_never_a_500_and_never_stored_as_infinity(client, token_a) -> None:
    body = "\n".join(
        line.rsplit(" ", 1)[0] + " -Inf" if line.startswith("DCGM_FI_DEV_XID_ERRORS") and GPU0 in line else line
        for line in DCGM.split("\n")
    )
    body = "\n".join(
        line.rsplit(" ", 1)[0] + " +Inf" if line.startswith("DCGM_FI_DEV_POWER_USAGE") and GPU1 in line else line
        for line in body.split("\n")
    )
    response = push(client, token_a, body)
    assert response.status_code == 202, response.content
    assert Gpu.objects.get(uuid=GPU0).state.xid is None and Gpu.objects.get(uuid=GPU1).state.power_w is None
    vllm = "\n".join(
        line.rsplit(" ", 1)[0] + (" +Inf" if "num_requests_running" in line else " -Inf")
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
        else line
        for line in VLLM.split("\n")
    )
    response = push(client, token_a, vllm)
    assert response.status_code == 202 and response.json()["ignored"] >= 2
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fleet_servingsample WHERE value IN ('Infinity', '-Infinity')")
        assert cursor.fetchone()[0] == 0


def test_the_same_series_twice_in_one_exposition_is_refused_naming_both_lines(client, token_a) -> None:
    first = next(line for line in VLLM.split("\n") if line.startswith("vllm:num_requests_running"))
    body = VLLM + first + "\n"
    response = push(client, token_a, body)
    assert response.status_code == 400, response.content
    message = response.json()["error"]
    assert f"line {len(body.rstrip().split(chr(10)))}" in message and f"line {line_of(VLLM, first)}" in message
    assert nothing_stored()


def test_a_series_replayed_under_another_key_is_stored_once(client, token_a) -> None:
    ms = int(timezone.now().timestamp() * 1000)
    stamped = "".join(
        f"{line} {ms}\n" if line and not line.startswith("#") else f"{line}\n" for line in VLLM.split("\n")
    )
    assert push(client, token_a, stamped, **{"Idempotency-Key": "one"}).status_code == 202
    assert push(client, token_a, stamped, **{"Idempotency-Key": "two"}).status_code == 202
    assert ServingSample.objects.count() == 76


@pytest.mark.parametrize(
    ("label", "limit"),
    [("model_name", 200), ("finished_reason", 1024)],
)
def test_a_label_longer_than_its_column_is_refused_naming_the_line_and_label(client, token_a, label, limit) -> None:
    long = "m" * (limit + 1)
    body = f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="a",{label}="{long}"}} 1\n'
    if label == "model_name":
        body = f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="{long}"}} 1\n'
    response = push(client, token_a, body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == label and response.json()["item"] == 2
    assert nothing_stored() and not Endpoint.objects.exists()


def test_a_gpu_model_name_longer_than_its_column_is_refused(client, token_a) -> None:
    body = DCGM.replace('modelName="NVIDIA H100 80GB HBM3"', f'modelName="{"H" * 65}"', 1)
    response = push(client, token_a, body)
    assert response.status_code == 400 and response.json()["field"] == "modelName", response.content
    assert nothing_stored()


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/x-protobuf", "application/x-www-form-urlencoded"]
)
def test_a_body_that_is_not_text_exposition_is_415(client, token_a, content_type) -> None:
    response = client.post(
        "/api/v1/ingest/prometheus", data=DCGM, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token_a}"
    )
    assert response.status_code == 415
    assert "text/plain" in response.json()["error"] and "application/openmetrics-text" in response.json()["error"]
    assert nothing_stored()


def test_openmetrics_text_is_read_as_openmetrics(client, token_a) -> None:
    """Timestamps in seconds, an exemplar, _created samples and # EOF, as OpenMetrics has them."""
    now = timezone.now().timestamp()
    body = (
        "# TYPE vllm:prompt_tokens counter\n"
        f'vllm:prompt_tokens_total{{model_name="llama"}} 1234 {now:.3f} # {{trace_id="abc"}} 1.0 {now:.3f}\n'
        f'vllm:prompt_tokens_created{{model_name="llama"}} 1700000000 {now:.3f}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="llama"}} 3 {now:.3f}\n'
        "# EOF\n"
    )
    response = client.post(
        "/api/v1/ingest/prometheus",
        data=body,
        content_type="application/openmetrics-text; version=1.0.0; charset=utf-8",
        HTTP_AUTHORIZATION=f"Bearer {token_a}",
    )
    assert response.status_code == 202, response.content
    assert response.json()["ignored_metrics"] == {"vllm:prompt_tokens_created": 1}
    stored = {r.metric: r for r in ServingSample.objects.all()}
    assert set(stored) == {"vllm:prompt_tokens_total", "vllm:num_requests_running"}
    assert stored["vllm:prompt_tokens_total"].value == 1234  # not the exemplar's value
    assert abs(stored["vllm:num_requests_running"].ts.timestamp() - now) < 0.01  # seconds, not ms
    truncated = push(client, token_a, body.replace("# EOF\n", ""))  # 0.0.4 text: fine without EOF
    assert truncated.status_code in (202, 400)
    no_eof = client.post(
        "/api/v1/ingest/prometheus",
        data=body.replace("# EOF\n", ""),
        content_type="application/openmetrics-text",
        HTTP_AUTHORIZATION=f"Bearer {token_a}",
    )
    assert no_eof.status_code == 400


def test_a_series_too_long_for_the_index_is_refused_at_the_door(client, token_a) -> None:
    """Label values within their limit, but together past what one index entry holds."""
    import secrets

    labels = ",".join(f'l{i}="{secrets.token_hex(450)}"' for i in range(3))  # 900 random bytes each
    body = f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="a",{labels}}} 1\n'
    response = push(client, token_a, body)
    assert response.status_code == 400 and response.json()["field"] == "labels", response.content
    assert nothing_stored()


@pytest.mark.parametrize("query", ["?endpoint=a%00b", "?endpoint=a%0Ab", "?hostname=gpu-1%0A"])
def test_query_options_that_would_become_bad_names_are_refused(client, token_a, query) -> None:
    response = push(client, token_a, VLLM if "endpoint" in query else DCGM, query)
    assert response.status_code == 400, response.content
    assert response.json()["field"] in ("endpoint", "hostname")
    assert nothing_stored()


def test_a_triton_version_that_is_not_a_number_is_stored_as_text(client, token_a) -> None:
    body = '# TYPE nv_inference_count counter\nnv_inference_count{model="m",version="²"} 1\n'
    assert push(client, token_a, body).status_code == 202
    assert Endpoint.objects.get(name="m").version == "²"


def test_a_mig_gpu_is_as_busy_as_its_instances_in_the_averages(client, token_a) -> None:
    assert push(client, token_a, MIG).status_code == 202
    # 3g (91.23 % active), 2g (65.51 %), 1g (18.72 %) of 7 slices.
    expected = (3 * 91.23 + 2 * 65.51 + 1 * 18.72) / 7
    assert Gpu.objects.get(uuid=MIG_GPU).state.gpu_util == pytest.approx(expected, abs=0.05)


def test_a_hostname_with_a_trailing_newline_is_not_a_host(client, token_a) -> None:
    from tests.conftest import make_sample, post_batch

    response = post_batch(client, token_a, {"samples": [make_sample(hostname="gpu-a-001\n")]})
    assert response.status_code == 400 and response.json()["field"] == "hostname"


def test_batches_queued_before_new_fields_existed_still_decode(db) -> None:
    """The queue carries samples as positional arrays; one written by the previous release
    (7 identity fields, then the 21 metrics it knew) must decode to the same values."""
    import msgspec

    from fleet.ingest.batches import decode_rows
    from fleet.telemetry.copyrows import metric_values

    ts = timezone.now()
    old_metrics = [50.0, 1.0, 100.0, 200.0, 61.0, 70.0, 612.0, 1980.0, 2619.0, 5, 79, 0, 2, 0, 0, 0, 17, 0, 0, 0.4, 0.5]
    old_row = [GPU0, "gpu-a-001", ts.isoformat(), 0, "H100", None, None, *old_metrics]
    [sample] = decode_rows(msgspec.msgpack.encode([old_row]))
    values = dict(zip([f.name for f in GPU_FIELDS], metric_values(sample), strict=True))
    assert (values["gpu_temp_c"], values["power_w"], values["xid"], values["pcie_replay_total"]) == (61, 612, 79, 17)
    assert values["thermal_violation_us"] is None and sample.mig_instance_id is None


def test_throttling_from_violation_counters_spans_minute_boundaries(site_a) -> None:
    """One scrape a minute: the counter's rise shows between minutes, never inside one."""
    base = timezone.now().replace(second=30, microsecond=0) - timedelta(minutes=2)
    for body, at in ((OLD, base), (OLD_LATER, base + timedelta(minutes=1))):
        store_exposition(parse_exposition(body, now=at), site_id=site_a.pk, batch_key=f"m-{at.isoformat()}")
    rollups.update_rollups()
    hot = {m.bucket: m.throttled_samples for m in GpuRollup1m.objects.filter(gpu__uuid=OLD_HOT)}
    assert hot[base.replace(second=0)] == 0 and hot[(base + timedelta(minutes=1)).replace(second=0)] == 1
    assert not any(m.throttled_samples for m in GpuRollup1m.objects.filter(gpu__uuid=OLD_DBE))


# --- 6. The Prometheus door's limits --------------------------------------------------------------


def _stamped_line(ms: float | str) -> str:
    return (
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{GPU0}",hostname="gpu-a-001"}} 61 {ms}\n'
        f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{GPU0}",hostname="gpu-a-001"}} 400\n'
    )


@pytest.mark.parametrize(
    "ms",
    [
        # Named: an id made of the time would differ between parallel workers, which must collect alike.
        pytest.param(int((datetime.now(UTC) + timedelta(days=2)).timestamp() * 1000), id="two-days-ahead"),
        "1e20",  # would overflow datetime
        "86400000",  # 1970
        "253402300799000",  # 9999-12-31
        "-62135596800000",  # year 1
        "NaN",
    ],
)
def test_timestamps_outside_the_window_are_refused_naming_the_line(client, token_a, ms) -> None:
    response = push(client, token_a, "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" + _stamped_line(ms))
    assert response.status_code == 400, response.content
    assert response.json()["item"] == 2 and response.json()["field"] == "timestamp"
    assert nothing_stored() and not Gpu.objects.exists()


def test_a_nul_in_a_label_is_refused_up_front(client, token_a) -> None:
    """PostgreSQL text cannot hold a NUL: accepted, it would fail in the worker after the 202."""
    needle = 'finished_reason="abort"'
    body = VLLM.replace(needle, 'finished_reason="ab\x00ort"', 1)
    response = push(client, token_a, body)
    assert response.status_code == 400 and response.json()["item"] == line_of(VLLM, needle), response.content
    assert nothing_stored() and not Endpoint.objects.exists()


def test_rollups_never_make_a_partition_per_day_since_1970(site_a) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fleet_rollupdirty (resolution, bucket, dirtied_at) "
            "VALUES ('1m', %s, now()), ('1m', %s, now())",
            [datetime(1970, 1, 2, 3, 4, tzinfo=UTC), timezone.now().replace(second=0, microsecond=0)],
        )
    before = len(partitions.existing_partitions(partitions.GPU_ROLLUP_1M))
    rollups.update_rollups()
    after = partitions.existing_partitions(partitions.GPU_ROLLUP_1M)
    assert len(after) - before <= 1 and not any(name.endswith("19700102") for name in after)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fleet_rollupdirty WHERE resolution = '1m'")
        assert cursor.fetchone()[0] == 0  # the 1970 minute left the queue instead of wedging it


def test_a_write_spanning_decades_is_refused_before_any_partition_is_made(db) -> None:
    before = partitions.existing_partitions(partitions.SAMPLES)
    with pytest.raises(partitions.TooManyPartitions):
        partitions.ensure_partitions(partitions.SAMPLES, datetime(1970, 1, 1, tzinfo=UTC), timezone.now())
    assert partitions.existing_partitions(partitions.SAMPLES) == before
