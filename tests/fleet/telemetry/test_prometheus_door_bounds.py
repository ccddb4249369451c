"""The Prometheus text door's bounds on what a push holds while it is checked (issue 37): its lines
(a tighter count for OpenMetrics, whose parser holds a family whole), its GPUs (as many as a JSON
batch's samples), and families read as their samples come in the 0.0.4 format."""

from __future__ import annotations

import time

from fleet.ingest import prometheus, remote_write
from fleet.ingest.remote_write import encode
from fleet.models import GpuSample, IngestBatch, ServingSample

PUSH = "/api/v1/ingest/prometheus"


def push(client, token: str, body: str, content_type: str = "text/plain; version=0.0.4"):  # type: ignore[no-untyped-def]
    return client.post(PUSH, data=body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token}")


def gpu_line(n: int) -> str:
    return f'DCGM_FI_DEV_GPU_TEMP{{UUID="GPU-{n:08d}-aaaa-bbbb",Hostname="gpu-a-{n:03d}",gpu="0"}} {50 + n}\n'


def nothing_written() -> bool:
    return (GpuSample.objects.count(), ServingSample.objects.count(), IngestBatch.objects.count()) == (0, 0, 0)


def test_a_push_of_more_gpus_than_a_json_batch_takes_is_refused_at_the_first_one_past(
    client, token_a, settings
) -> None:
    settings.INGEST_MAX_ITEMS = 2
    text = "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" + "".join(gpu_line(n) for n in range(3))

    response = push(client, token_a, text)

    assert response.status_code == 413, response.content
    assert response.json()["error"].startswith("line 4: a push with samples of more than 2 GPUs")
    assert "GOODPUT_INGEST_MAX_ITEMS" in response.json()["error"]
    assert (response.json()["item"], response.json()["field"]) == (4, "UUID")
    assert nothing_written()
    assert push(client, token_a, "".join(gpu_line(n) for n in range(2))).status_code == 202
    assert GpuSample.objects.count() == 2


def test_an_openmetrics_push_takes_fewer_lines_than_a_text_one(client, token_a, monkeypatch) -> None:
    monkeypatch.setattr(prometheus, "OPENMETRICS_MAX_LINES", 3)
    body = "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" + gpu_line(0) + gpu_line(1) + "# EOF\n"

    refused = push(client, token_a, body, "application/openmetrics-text; version=1.0.0")

    assert refused.status_code == 413, refused.content
    assert refused.json()["error"] == "The exposition has 4 lines; at most 3 in the OpenMetrics format."
    assert nothing_written()
    assert push(client, token_a, body.removesuffix("# EOF\n")).status_code == 202


def test_a_malformed_metadata_line_is_refused_naming_it_though_the_parser_reads_samples_alone(client, token_a) -> None:
    """Comment lines are checked by the parser one by one, as it checked them in a family."""
    for bad, words in (("# TYPE DCGM_FI_DEV_GPU_TEMP", "cannot parse (ValueError)"), ("# HELP 1bad x", "cannot parse")):
        response = push(client, token_a, gpu_line(0) + bad + "\n" + gpu_line(1))
        assert response.status_code == 400, response.content
        assert response.json()["error"].startswith(f"line 2: {words}") and response.json()["item"] == 2
    assert nothing_written()


def test_a_counter_family_read_sample_by_sample_keeps_its_exposed_names() -> None:
    """A counter declared without _total: prometheus_client renames its samples when it reads the
    family whole; read sample by sample, they keep the names the exporter wrote."""
    parsed = prometheus.parse_exposition(
        "# TYPE vllm:request_success counter\n"
        'vllm:request_success{model_name="m",finished_reason="stop"} 7\n'
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{model_name="m"} 70\n'
    )
    assert sorted(p.metric for p in parsed.serving) == ["vllm:prompt_tokens_total", "vllm:request_success"]


def test_a_remote_write_scrape_of_more_series_than_a_text_push_has_lines_is_refused(
    client, token_a, monkeypatch
) -> None:
    monkeypatch.setattr(remote_write, "MAX_LINES", 2)
    ts = (int(time.time()) - 30) * 1000
    gpus = [{"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": f"GPU-{n:08d}-aaaa", "hostname": "h"} for n in range(3)]
    body = encode([(labels, [(50.0, ts)]) for labels in gpus])

    response = client.post(
        "/api/v1/ingest/prometheus/remote-write",
        data=body,
        content_type="application/x-protobuf",
        HTTP_AUTHORIZATION=f"Bearer {token_a}",
        HTTP_CONTENT_ENCODING="snappy",
    )

    assert response.status_code == 413, response.content
    assert response.json()["error"].startswith(f"The WriteRequest holds 3 samples at {ts} ms")
    assert nothing_written()
