"""POST /api/v1/ingest/prometheus: dcgm-exporter and vLLM scrapes pushed as is."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core import signals
from django.core.asgi import get_asgi_application
from django.db import close_old_connections

from fleet.ingest.prometheus import parse_exposition
from fleet.models import Endpoint, Gpu, GpuSample, GpuState, IngestBatch, ServingSample
from fleet.telemetry.mappings import DCGM_FIELDS, DCGM_KNOWN_UNSTORED

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
    response = push(client, token_a, DCGM)  # held back as a claim (fleet.inventory.claims), nothing written
    assert response.status_code == 409 and response.json()["field"] == "hostname"
    assert response.json()["batch"] is None and not Node.objects.filter(site__name="ams-1").exists()


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


def _asgi_post(path: str, token: str, chunks: list[bytes]) -> tuple[int, bytes]:
    """POST through Django's ASGI handler, as uvicorn hands it a chunked body: no Content-Length
    header, the body in several http.request messages. Returns (status, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"text/plain; version=0.0.4"),
            (b"transfer-encoding", b"chunked"),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected until the answer (Django listens)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    # As Django's test client does: the handler's end-of-request signal would close the test's
    # connection (and its transaction) otherwise.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        async_to_sync(get_asgi_application())(scope, receive, send)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_chunked_body_over_the_limit_gets_413_naming_the_limit(site_a, token_a, settings) -> None:
    settings.INGEST_MAX_BYTES = 64 * 1024
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = settings.INGEST_MAX_BYTES + 1024
    padding = ("# " + "x" * 1020 + "\n").encode()
    chunks = [VLLM.encode(), *[padding] * 80]  # about 80 KB, in 81 chunks, no Content-Length
    for path in ("/api/v1/ingest/prometheus", "/api/v1/ingest/gpu-samples"):
        status, body = _asgi_post(path, token_a, chunks)
        assert status == 413, (path, body[:300])
        assert "limit of 65536 bytes" in json.loads(body)["error"], body
    assert ServingSample.objects.count() == 0
    # Under the limit, the same chunked push is read and stored.
    status, body = _asgi_post("/api/v1/ingest/prometheus", token_a, [VLLM.encode()[:500], VLLM.encode()[500:]])
    assert status == 202, body
    assert ServingSample.objects.count() == 76


# --- dcgm-exporter's NVLink counters --------------------------------------------------------------

NVLINK = (FIXTURES / "dcgm-exporter-nvlink.prom").read_text()


def test_nvlink_crc_flit_errors_are_stored_and_the_other_nvlink_series_counted_as_ignored(client, token_a) -> None:
    """The CRC flit errors have a column; replays, recoveries, data CRC errors and bandwidth do not
    yet (a GPU sample column each, and a migration): they are ignored and counted, never a 400."""
    response = push(client, token_a, NVLINK)
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["gpu_samples"] == 2
    # Six known series, one per GPU each: twelve samples not stored, each name counted.
    assert body["ignored"] == 12
    assert body["ignored_metrics"] == {name: 2 for name in sorted(DCGM_KNOWN_UNSTORED)}
    gpu1 = Gpu.objects.select_related("state").get(uuid=GPU1)
    assert gpu1.state.nvlink_crc_errors_total == 1843 and gpu1.state.gpu_util == 41
    assert GpuSample.objects.get(gpu=gpu1).nvlink_crc_errors_total == 1843
    assert GpuSample.objects.get(gpu__uuid=GPU0).nvlink_crc_errors_total == 0


def test_the_known_unstored_nvlink_names_are_dcgm_exporters_and_not_mapped() -> None:
    """Every name the fixture (written from dcgm-exporter's counters CSV) exports is either mapped
    to a GPU sample field or listed as known but unstored; none is both."""
    exposition = parse_exposition(NVLINK)
    assert set(exposition.ignored_metrics) == DCGM_KNOWN_UNSTORED
    assert not DCGM_KNOWN_UNSTORED & set(DCGM_FIELDS)
    assert DCGM_FIELDS["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == "nvlink_crc_errors_total"
    exported = {line.split("{")[0] for line in NVLINK.splitlines() if line and not line.startswith("#")}
    assert exported == DCGM_KNOWN_UNSTORED | {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"}
