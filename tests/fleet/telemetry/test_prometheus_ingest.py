"""POST /api/v1/ingest/prometheus: dcgm-exporter and vLLM scrapes pushed as is."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.ingest.prometheus import parse_exposition
from fleet.models import Endpoint, Gpu, GpuSample, GpuState, IngestBatch, ServingSample

# Copies of ../shared/fixtures (the real formats), kept in the repository so the suite runs anywhere.
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DCGM = (FIXTURES / "dcgm-exporter.prom").read_text()
VLLM = (FIXTURES / "vllm.prom").read_text()
GPU0 = "GPU-3f1c2a9e-8b1d-4c55-9e0a-1b2c3d4e5f60"
GPU1 = "GPU-7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"
LLAMA = "meta-llama/Llama-3.1-70B-Instruct"


def push(client, token: str, body: str, query: str = "", **headers: str):  # type: ignore[no-untyped-def]
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(
        f"/api/v1/ingest/prometheus{query}",
        data=body,
        content_type="text/plain; version=0.0.4",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        **extra,
    )


def test_a_dcgm_exporter_scrape_lands_on_the_right_gpus(client, site_a, token_a) -> None:
    response = push(client, token_a, DCGM)
    assert response.status_code == 202, response.content
    assert response.json()["gpu_samples"] == 2
    gpu0 = Gpu.objects.select_related("node", "state").get(uuid=GPU0)
    gpu1 = Gpu.objects.select_related("node", "state").get(uuid=GPU1)
    assert gpu0.node.hostname == gpu1.node.hostname == "gpu-a-001" and gpu0.node.site == site_a
    assert (gpu0.index, gpu1.index) == (0, 1) and gpu0.model == "NVIDIA H100 80GB HBM3"
    assert gpu0.state.gpu_temp_c == 61 and gpu1.state.gpu_temp_c == 87
    assert gpu0.state.power_w == pytest.approx(612.337, rel=1e-6)
    assert gpu0.state.memory_temp_c == 70
    assert gpu1.state.memory_temp_c is None  # DCGM's blank sentinel is "no value", not 9.2e18 °C
    assert (gpu0.state.xid, gpu1.state.xid) == (0, 79)
    assert gpu1.state.remapped_rows_uncorrectable == 2 and gpu1.state.pcie_replay_total == 17
    assert gpu0.state.energy_mj == 918273645512  # a counter: its name was not mangled by the parser
    assert gpu0.state.tensor_active == pytest.approx(0.412, rel=1e-6)
    assert gpu1.state.fb_used_mib == 79911 and gpu1.hbm_gib == round((79911 + 1568) / 1024)
    stored = GpuSample.objects.get(gpu=gpu1)
    assert stored.memory_temp_c is None and stored.xid == 79


def test_a_vllm_scrape_is_stored_as_series_of_its_endpoint(client, site_a, token_a) -> None:
    response = push(client, token_a, VLLM)
    assert response.status_code == 202, response.content
    assert response.json()["serving_samples"] == 76
    endpoint = Endpoint.objects.get()
    assert (endpoint.name, endpoint.framework, endpoint.model_name, endpoint.site) == (LLAMA, "vllm", LLAMA, site_a)
    rows = ServingSample.objects.filter(endpoint=endpoint)
    assert rows.count() == 76
    bucket = rows.get(metric="vllm:time_to_first_token_seconds_bucket", series='engine="0",le="0.25"')
    assert bucket.value == 26862
    assert rows.get(metric="vllm:kv_cache_usage_perc").value == pytest.approx(0.8713)
    assert rows.get(metric="vllm:request_success_total", series='engine="0",finished_reason="abort"').value == 37
    assert rows.filter(metric="vllm:inter_token_latency_seconds_bucket").count() == 20


def test_a_push_retried_under_its_idempotency_key_stores_nothing_twice(client, token_a) -> None:
    for _ in range(3):
        assert push(client, token_a, DCGM + VLLM, **{"Idempotency-Key": "scrape-0001"}).status_code == 202
    assert GpuSample.objects.count() == 2 and ServingSample.objects.count() == 76


def test_the_older_hostname_label_and_lowercase_uuid_are_accepted(client, token_a) -> None:
    old = DCGM.replace("hostname=", "Hostname=").replace("UUID=", "uuid=")
    assert push(client, token_a, old).status_code == 202
    assert Gpu.objects.get(uuid=GPU1).node.hostname == "gpu-a-001"


def test_an_exporter_without_hostname_labels_needs_the_hostname_parameter(client, token_a) -> None:
    bare = DCGM.replace(',hostname="gpu-a-001"', "")
    response = push(client, token_a, bare)
    assert response.status_code == 400
    assert response.json()["field"] == "hostname" and "?hostname=" in response.json()["error"]
    assert push(client, token_a, bare, "?hostname=dgx-17").status_code == 202
    assert Gpu.objects.get(uuid=GPU0).node.hostname == "dgx-17"


def test_mig_instances_become_child_gpus(client, token_a) -> None:
    body = (
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{GPU0}",hostname="h1",modelName="NVIDIA H100 80GB HBM3"}} 50\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{GPU0}",hostname="h1",GPU_I_PROFILE="1g.10gb",GPU_I_ID="3"}} 20\n'
    )
    assert push(client, token_a, body).status_code == 202
    child = Gpu.objects.get(parent__uuid=GPU0)
    assert child.uuid == f"MIG-{GPU0[4:]}-gi3" and child.mig_profile == "1g.10gb"
    assert child.state.gpu_util == 20 and Gpu.objects.get(uuid=GPU0).state.gpu_util == 50


def test_kubernetes_labels_are_accepted(client, token_a) -> None:
    k8s = DCGM.replace(
        'DCGM_FI_DRIVER_VERSION="570.124.06"', 'DCGM_FI_DRIVER_VERSION="570.124.06",pod="",namespace="",container=""'
    )
    assert push(client, token_a, k8s).status_code == 202
    assert GpuState.objects.count() == 2


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        ('# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0"} abc\n', 2, "cannot parse"),
        (
            'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m} 2\n',
            2,
            "cannot parse",
        ),
        (DCGM.replace("} 612.337", "} -5"), 22, "power_w"),
        (DCGM.replace('UUID="GPU-7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d",', "", 1), 7, "UUID"),
        (DCGM.replace('UUID="GPU-7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d",', 'UUID="GPU 0",', 1), 7, "gpu_uuid"),
    ],
    ids=["not a number", "unterminated label", "negative power", "no UUID", "malformed UUID"],
)
def test_malformed_text_is_refused_naming_the_line_and_nothing_is_written(client, token_a, body, line, words) -> None:
    response = push(client, token_a, VLLM + "\n" + body if "vllm" in body else body)
    if "vllm" in body:
        line += VLLM.count("\n") + 1
    assert response.status_code == 400, response.content
    assert f"line {line}" in response.json()["error"] and words in response.json()["error"]
    assert response.json()["item"] == line
    assert (GpuSample.objects.count(), ServingSample.objects.count(), IngestBatch.objects.count()) == (0, 0, 0)


def test_a_push_with_nothing_we_store_is_refused(client, token_a) -> None:
    response = push(client, token_a, "# TYPE go_goroutines gauge\ngo_goroutines 12\n")
    assert response.status_code == 400 and "No GPU or serving metrics" in response.json()["error"]


def test_a_push_needs_an_agent_token_and_its_site(client, token_a, site_b) -> None:
    assert client.post("/api/v1/ingest/prometheus", data=DCGM, content_type="text/plain").status_code == 401
    from fleet.models import Node

    Node.objects.create(site=site_b, hostname="gpu-a-001")
    response = push(client, token_a, DCGM)
    assert response.status_code == 403 and response.json()["field"] == "hostname"


def test_triton_counters_keep_their_exposed_names() -> None:
    body = (
        "# TYPE nv_inference_request_success counter\n"
        'nv_inference_request_success{model="resnet",version="1"} 42\n'
        "# TYPE nv_inference_queue_duration_us counter\n"
        'nv_inference_queue_duration_us{model="resnet",version="1"} 1200\n'
    )
    exposition = parse_exposition(body)
    assert [(p.metric, p.endpoint, p.framework) for p in exposition.serving] == [
        ("nv_inference_request_success", "resnet", "triton"),
        ("nv_inference_queue_duration_us", "resnet", "triton"),
    ]
    assert {p.version for p in exposition.serving} == {"1"}
