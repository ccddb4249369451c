"""POST /api/v1/ingest/prometheus/remote-write: Prometheus remote_write 1.0 (a snappy-compressed
protobuf WriteRequest), mapped exactly as the text door maps the same samples."""

from __future__ import annotations

import re
import struct
import time
from pathlib import Path

import cramjam
import pytest

from console import queues
from console.limits import limit_for
from fleet.ingest import push_queue, remote_write
from fleet.ingest.remote_write import STALE_NAN_BITS, encode, write_request_class
from fleet.models import Gpu, GpuSample, GpuState, IngestBatch, ServingSample

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DCGM = (FIXTURES / "dcgm-exporter.prom").read_text()
VLLM = (FIXTURES / "vllm.prom").read_text()
GPU0 = "GPU-3f1c2a9e-8b1d-4c55-9e0a-1b2c3d4e5f60"
GPU1 = "GPU-7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"
URL = "/api/v1/ingest/prometheus/remote-write"
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series_of(text: str, **extra: str) -> list[tuple[dict[str, str], float]]:
    """The fixture's samples as Prometheus holds them after a scrape: (labels with __name__, value)."""
    out = []
    for line in text.splitlines():
        if match := SAMPLE_LINE.match(line):
            labels = {
                k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                for k, v in LABEL.findall(match.group(2) or "")
            }
            out.append(({"__name__": match.group(1), **labels, **extra}, float(match.group(3))))
    return out


def write_request(text: str, *timestamps: int, **extra: str) -> bytes:
    return encode([(labels, [(value, ts) for ts in timestamps]) for labels, value in series_of(text, **extra)])


def now_ms(seconds_ago: int = 30) -> int:
    return (int(time.time()) - seconds_ago) * 1000


def send(client, token: str | None, body: bytes, query: str = "", **headers: str):  # type: ignore[no-untyped-def]
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    if token:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    extra.setdefault("HTTP_CONTENT_ENCODING", "snappy")
    extra.setdefault("HTTP_X_PROMETHEUS_REMOTE_WRITE_VERSION", "0.1.0")
    return client.post(f"{URL}{query}", data=body, content_type="application/x-protobuf", **extra)


def stored_samples() -> dict[str, dict]:
    rows = GpuSample.objects.values()
    return {Gpu.objects.get(pk=row.pop("gpu_id")).uuid: row for row in rows}


def with_timestamps(text: str, ts: int) -> str:
    return "".join(f"{line} {ts}\n" if SAMPLE_LINE.match(line) else f"{line}\n" for line in text.splitlines())


def test_dcgm_series_are_stored_exactly_as_the_same_samples_through_the_text_door(client, token_a) -> None:
    ts = now_ms()
    text = client.post(
        "/api/v1/ingest/prometheus",
        data=with_timestamps(DCGM, ts),
        content_type="text/plain; version=0.0.4",
        HTTP_AUTHORIZATION=f"Bearer {token_a}",
    )
    assert text.status_code == 202, text.content
    through_text = stored_samples()
    assert set(through_text) == {GPU0, GPU1}
    GpuSample.objects.all().delete()
    IngestBatch.objects.all().delete()

    # As Prometheus sends them: its target labels added, the series in its own order.
    response = send(client, token_a, write_request(DCGM, ts, instance="10.0.0.7:9400", job="dcgm"))
    assert response.status_code == 204, response.content
    assert response.content == b""
    assert stored_samples() == through_text
    gpu0, gpu1 = GpuState.objects.get(gpu__uuid=GPU0), GpuState.objects.get(gpu__uuid=GPU1)
    assert (gpu0.gpu_temp_c, gpu1.gpu_temp_c) == (61, 87)
    assert gpu1.memory_temp_c is None  # DCGM's blank sentinel survives the float64 of the protobuf
    assert gpu0.energy_mj == 918273645512 and gpu1.xid == 79
    assert Gpu.objects.get(uuid=GPU0).node.hostname == "gpu-a-001"
    assert int(through_text[GPU0]["ts"].timestamp() * 1000) == ts  # the sample's own time, not the receive time


def test_vllm_series_map_as_through_the_text_door_and_other_series_are_ignored(client, site_a, token_a) -> None:
    ts = now_ms()
    series = [(labels, [(value, ts)]) for labels, value in series_of(VLLM, job="vllm")]
    series += [({"__name__": "up", "job": "vllm"}, [(1.0, ts)]), ({"__name__": "go_goroutines"}, [(12.0, ts)])]
    response = send(client, token_a, encode(series))
    assert response.status_code == 204, response.content
    rows = ServingSample.objects.all()
    assert rows.count() == 76
    assert rows.get(metric="vllm:kv_cache_usage_perc").value == pytest.approx(0.8713)
    bucket = rows.get(metric="vllm:time_to_first_token_seconds_bucket", series='engine="0",job="vllm",le="0.25"')
    assert bucket.value == 26862 and int(bucket.ts.timestamp() * 1000) == ts
    assert not rows.filter(metric__in=["up", "go_goroutines"]).exists()


def test_a_request_of_only_unmapped_series_is_accepted_and_stores_nothing(client, token_a) -> None:
    body = encode([({"__name__": "node_load1", "instance": "n1"}, [(0.5, now_ms())])])
    assert send(client, token_a, body).status_code == 204
    assert (GpuSample.objects.count(), ServingSample.objects.count(), IngestBatch.objects.count()) == (0, 0, 0)


def test_a_retried_request_stores_nothing_twice(client, token_a) -> None:
    body = write_request(DCGM + VLLM, now_ms(), job="x")
    for _ in range(3):
        assert send(client, token_a, body).status_code == 204
    assert GpuSample.objects.count() == 2 and ServingSample.objects.count() == 76
    batches = IngestBatch.objects.count()
    # The same samples sent again later (a resend after a timeout) are still the same samples.
    time.sleep(1)
    assert send(client, token_a, body).status_code == 204
    assert IngestBatch.objects.count() == batches and GpuSample.objects.count() == 2


def test_several_scrapes_in_one_request_are_one_sample_each(client, token_a) -> None:
    first, second = now_ms(45), now_ms(30)
    response = send(client, token_a, write_request(DCGM, first, second))
    assert response.status_code == 204, response.content
    times = sorted({int(s.ts.timestamp() * 1000) for s in GpuSample.objects.all()})
    assert times == [first, second] and GpuSample.objects.count() == 4


def test_staleness_markers_are_not_readings(client, token_a) -> None:
    stale = struct.unpack("<d", STALE_NAN_BITS.to_bytes(8, "little"))[0]
    labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": GPU0, "hostname": "h1", "gpu": "0"}
    response = send(client, token_a, encode([(labels, [(55.0, now_ms(45)), (stale, now_ms(30))])]))
    assert response.status_code == 204
    [sample] = GpuSample.objects.all()
    assert sample.gpu_temp_c == 55


@pytest.mark.parametrize(
    ("body", "words", "field"),
    [
        (b"\x05hello", "snappy", "body"),
        (b"\xff\xff\xff\x0f" + b"x" * 20, "declares 33554431 bytes from 24", "body"),
        (b"", "empty", "body"),
        (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff\xff")), "protobuf", "body"),
        (encode([({"job": "dcgm"}, [(1.0, 0)])]), "timeseries[0] has no __name__", "__name__"),
        (encode([({"__name__": "a-b"}, [(1.0, 0)])]), "metric name 'a-b'", "__name__"),
    ],
    ids=["not snappy", "impossible length", "empty", "not protobuf", "no name", "bad name"],
)
def test_a_malformed_request_is_refused_naming_what_is_wrong(client, token_a, body, words, field) -> None:
    response = send(client, token_a, body)
    assert response.status_code == 400, response.content
    assert words in response.json()["error"] and response.json()["field"] == field
    assert IngestBatch.objects.count() == 0


def test_a_bad_sample_is_refused_naming_its_series_and_nothing_is_written(client, token_a) -> None:
    ts = now_ms()
    good = series_of(DCGM)
    bad = [({k: v for k, v in labels.items() if k != "UUID"}, value) for labels, value in good[:1]]
    response = send(client, token_a, encode([(labels, [(value, ts)]) for labels, value in good + bad]))
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"].startswith(f"timeseries[{len(good)}] (DCGM_FI_DEV_SM_CLOCK): ")
    assert "UUID" in body["error"] and body["item"] == len(good) and body["field"] == "UUID"
    assert (GpuSample.objects.count(), IngestBatch.objects.count()) == (0, 0)


def test_a_sample_older_than_the_window_is_refused(client, token_a, settings) -> None:
    response = send(client, token_a, write_request(DCGM, now_ms(settings.INGEST_MAX_AGE_SECONDS + 60)))
    assert response.status_code == 400 and response.json()["field"] == "timestamp"
    assert "older than" in response.json()["error"]


def test_remote_write_2_and_other_encodings_get_415(client, token_a) -> None:
    body = write_request(DCGM, now_ms())
    v2 = client.post(
        URL,
        data=body,
        content_type="application/x-protobuf;proto=io.prometheus.write.v2.Request",
        HTTP_CONTENT_ENCODING="snappy",
        HTTP_AUTHORIZATION=f"Bearer {token_a}",
    )
    assert v2.status_code == 415 and v2.json()["field"] == "Content-Type"
    assert send(client, token_a, body, **{"Content-Encoding": "gzip"}).status_code == 415
    assert IngestBatch.objects.count() == 0


def test_a_declared_size_past_the_limit_is_refused_before_inflating(client, token_a, settings) -> None:
    settings.INGEST_MAX_BYTES = 4096
    response = send(client, token_a, bytes(cramjam.snappy.compress_raw(b"\x00" * 10_000)))
    assert response.status_code == 413 and "10000 bytes uncompressed" in response.json()["error"]
    # The outer door (console.limits) holds it to the ingest class of limits, as the text door.
    assert limit_for(URL) == limit_for("/api/v1/ingest/prometheus") > limit_for("/healthz")


def test_it_needs_an_agent_token(client, token_a, viewer_user) -> None:
    body = write_request(DCGM, now_ms())
    assert send(client, None, body).status_code == 401
    assert send(client, "gp_not-a-token", body).status_code == 401
    client.force_login(viewer_user)
    assert send(client, None, body).status_code in (401, 403)
    assert GpuSample.objects.count() == 0


def test_a_full_queue_answers_429_with_retry_after_and_queues_nothing(client, token_a, broker_mode, settings) -> None:
    settings.INGEST_QUEUE_BOUND = 1
    body = write_request(DCGM, now_ms())
    assert send(client, token_a, body).status_code == 204  # queued for a writer: one push waiting
    assert broker_mode.xlen(push_queue.STREAM) == 1 and GpuSample.objects.count() == 0
    queues.reset()
    response = send(client, token_a, write_request(DCGM, now_ms(20)))
    assert response.status_code == 429
    assert response["Retry-After"] == "2" and "bound 1" in response.json()["error"]
    assert broker_mode.xlen(push_queue.STREAM) == 1


def test_the_write_request_class_reads_what_prometheus_writes() -> None:
    """Field numbers as in prometheus/prompb (types.proto: Label 1/2, Sample value 1 timestamp 2;
    remote.proto: WriteRequest.timeseries 1): bytes written by hand in the wire format decode."""
    label = b"\x0a\x08__name__" + b"\x12\x01x"  # Label{name=1, value=2}
    sample = b"\x09" + struct.pack("<d", 1.5) + b"\x10\x2a"
    series = b"\x0a" + bytes([len(label)]) + label + b"\x12" + bytes([len(sample)]) + sample
    request = write_request_class().FromString(b"\x0a" + bytes([len(series)]) + series)
    [ts] = request.timeseries
    assert (ts.labels[0].name, ts.labels[0].value) == ("__name__", "x")
    assert (ts.samples[0].value, ts.samples[0].timestamp) == (1.5, 42)
    assert remote_write.decode(bytes(cramjam.snappy.compress_raw(request.SerializeToString())))[0].text == "x 1.5 42\n"
