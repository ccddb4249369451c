"""remote_write's bounds (issue 37): every sample is read as a text line carrying all its series'
labels, so a request is held to what it expands to before any of that text is built: a series'
labels (GOODPUT_REMOTE_WRITE_MAX_LABEL_BYTES), the text all its samples come to (a text push's
GOODPUT_INGEST_MAX_BYTES) and its timestamps (remote_write.MAX_TIMESTAMPS)."""

from __future__ import annotations

import struct
import time

import pytest

from fleet.ingest import push_queue, remote_write
from fleet.ingest.remote_write import encode
from fleet.models import GpuSample, IngestBatch

URL = "/api/v1/ingest/prometheus/remote-write"
GPU0 = "GPU-3f1c2a9e-8b1d-4c55-9e0a-1b2c3d4e5f60"


def now_ms(seconds_ago: int = 30) -> int:
    return (int(time.time()) - seconds_ago) * 1000


def send(client, token: str, body: bytes):  # type: ignore[no-untyped-def]
    return client.post(
        URL,
        data=body,
        content_type="application/x-protobuf",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        HTTP_CONTENT_ENCODING="snappy",
        HTTP_X_PROMETHEUS_REMOTE_WRITE_VERSION="0.1.0",
    )


def gpu_labels(**extra: str) -> dict[str, str]:
    return {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": GPU0, "hostname": "gpu-a-001", "gpu": "0", **extra}


def label_bytes(labels: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in labels.items())


def padded_to(size: int) -> dict[str, str]:
    """A series the console ignores whose labels come to exactly ``size`` bytes (its ``pad`` label
    makes them up; a mapped series' labels are held to its columns' lengths anyway)."""
    labels = {"__name__": "kube_pod_labels", "pod": "trainer-0", "pad": ""}
    labels["pad"] = "p" * (size - label_bytes(labels))
    return labels


def as_text(body: bytes) -> bytes:
    """What the door reads the request as: its expositions, one per timestamp."""
    return "".join(chunk.text for chunk in remote_write.decode(body)).encode()


def test_the_reported_request_is_refused_naming_the_series_and_its_label(client, token_a, broker_mode) -> None:
    """One series with a 10 KB label and 60,000 samples, about 300 KB snappy-compressed: 600 MB
    as text lines, each carrying the label. Refused at its labels, before any line is built."""
    labels = {"__name__": "probe_series", "big": "A" * 10_240}
    body = encode([(labels, [(1.0, now_ms(120) + n) for n in range(60_000)])])
    assert len(body) < 400_000

    response = send(client, token_a, body)

    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["error"].startswith(f"timeseries[0] (probe_series): its labels come to {label_bytes(labels):,} bytes")
    assert "label big alone 10,243" in answer["error"] and "GOODPUT_REMOTE_WRITE_MAX_LABEL_BYTES" in answer["error"]
    assert (answer["item"], answer["field"]) == (0, "big")
    assert broker_mode.xlen(push_queue.STREAM) == 0 and IngestBatch.objects.count() == 0


def test_a_series_the_console_ignores_is_bounded_too(client, token_a) -> None:
    ignored = {"__name__": "kube_pod_annotations", "annotation_blob": "x" * 9_000}
    body = encode([(gpu_labels(), [(55.0, now_ms())]), (ignored, [(1.0, now_ms())])])

    response = send(client, token_a, body)

    assert response.status_code == 400, response.content
    assert response.json()["error"].startswith("timeseries[1] (kube_pod_annotations): its labels come to")
    assert response.json()["field"] == "annotation_blob"
    assert GpuSample.objects.count() == 0  # the good series in the same request is not half-written


def test_labels_up_to_the_bound_are_accepted_and_one_byte_more_is_not(client, token_a, settings) -> None:
    limit = settings.REMOTE_WRITE_MAX_LABEL_BYTES

    at_limit = send(
        client, token_a, encode([(gpu_labels(), [(55.0, now_ms())]), (padded_to(limit), [(1.0, now_ms())])])
    )
    past_it = send(client, token_a, encode([(gpu_labels(), [(56.0, now_ms(20))]), (padded_to(limit + 1), [(1.0, 0)])]))

    assert at_limit.status_code == 204, at_limit.content
    assert past_it.status_code == 400 and (past_it.json()["item"], past_it.json()["field"]) == (1, "pad")
    assert f"at most {limit:,} a series" in past_it.json()["error"]
    [sample] = GpuSample.objects.all()
    assert sample.gpu_temp_c == 55


def test_a_request_that_expands_past_a_text_pushs_limit_is_refused_before_any_text_is_built(
    client, token_a, settings, monkeypatch
) -> None:
    """Labels within the bound, but 4 KB of them on each of 2,000 samples: 8 MB of text from a
    few kilobytes. 413 naming the series that weighs most; no exposition is rendered."""
    settings.INGEST_MAX_BYTES = 1024 * 1024
    heavy = {"__name__": "wide_series", "blob": "b" * 4_000}
    body = encode([(gpu_labels(), [(55.0, now_ms())]), (heavy, [(1.0, now_ms(60) + n) for n in range(2_000)])])
    assert len(body) < 64 * 1024

    def rendered(self):  # type: ignore[no-untyped-def]
        raise AssertionError("an exposition was built for a request past its bound")

    monkeypatch.setattr(remote_write.Decoded, "chunks", rendered)
    response = send(client, token_a, body)

    assert response.status_code == 413, response.content
    answer = response.json()
    assert answer["error"].startswith("The WriteRequest comes to more than 1,048,576 bytes as text exposition")
    assert "timeseries[1] (wide_series) alone comes to" in answer["error"]
    assert "max_samples_per_send" in answer["error"]
    assert (answer["item"], answer["field"]) == (1, "samples")
    assert (GpuSample.objects.count(), IngestBatch.objects.count()) == (0, 0)


def test_the_text_bound_is_the_text_the_door_reads(client, token_a, settings) -> None:
    """Accepted when its expositions come to exactly the limit; one byte less, refused."""
    series = [
        (gpu_labels(), [(55.0, now_ms(60)), (56.5, now_ms(45)), (float("nan"), now_ms(30))]),
        ({"__name__": "go_goroutines", "job": 'dcgm "exporter"\n'}, [(12.0, now_ms(60)), (-3e-7, now_ms(45))]),
    ]
    body = encode(series)
    size = len(as_text(body))

    settings.INGEST_MAX_BYTES = size - 1
    assert send(client, token_a, body).status_code == 413
    settings.INGEST_MAX_BYTES = size
    response = send(client, token_a, body)
    assert response.status_code == 204, response.content
    assert GpuSample.objects.count() == 3


def test_more_timestamps_than_the_bound_are_refused(client, token_a, monkeypatch) -> None:
    monkeypatch.setattr(remote_write, "MAX_TIMESTAMPS", 3)
    three = encode([(gpu_labels(), [(50.0 + n, now_ms(60 - n)) for n in range(3)])])
    four = encode([(gpu_labels(), [(50.0 + n, now_ms(60 - n)) for n in range(4)])])

    refused = send(client, token_a, four)
    assert refused.status_code == 413, refused.content
    assert refused.json()["error"].startswith("The WriteRequest holds samples of more than 3 timestamps")
    assert GpuSample.objects.count() == 0
    assert send(client, token_a, three).status_code == 204
    assert GpuSample.objects.count() == 3


@pytest.mark.parametrize("stale_first", [True, False])
def test_staleness_markers_count_for_nothing(client, token_a, monkeypatch, stale_first) -> None:
    """A staleness marker is no line of text and no timestamp to store."""
    monkeypatch.setattr(remote_write, "MAX_TIMESTAMPS", 1)
    stale = struct.unpack("<d", remote_write.STALE_NAN_BITS.to_bytes(8, "little"))[0]
    samples = [(stale, now_ms(45)), (55.0, now_ms(30))]
    body = encode([(gpu_labels(), samples if stale_first else samples[::-1])])
    assert send(client, token_a, body).status_code == 204
    assert GpuSample.objects.get().gpu_temp_c == 55
