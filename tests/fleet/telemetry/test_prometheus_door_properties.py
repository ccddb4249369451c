"""A property of the Prometheus door, over generated expositions: whatever the body (any metric
family, labels of any length and character including NUL, NaN and ±Inf, duplicate series,
timestamps from year 1 to 9999, truncated bodies), the door never answers 5xx; on a 4xx nothing
is written; on a 202 everything it counted is stored.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.inventory import directory
from fleet.models import Endpoint, Gpu, GpuSample, IngestBatch, Node, ServingSample
from fleet.telemetry import partitions
from fleet.telemetry.fields import GPU_SAMPLE_FIELDS

EXAMPLES = 2000
KNOWN_NAMES = [
    *(f.dcgm for f in GPU_SAMPLE_FIELDS),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_FB_RESERVED",
    "vllm:num_requests_running",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:prompt_tokens_total",
    "nv_inference_request_success",
    "nv_inference_queue_duration_us",
    "nv_gpu_utilization",
    "nv_energy_consumption",
    "tgi_queue_size",
    "tgi_request_duration_bucket",
    "go_goroutines",
]
UUIDS = ["GPU-3f1c2a9e-8b1d-4c55-9e0a-1b2c3d4e5f60", "GPU-7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d", "GPU-x"]
NOW_MS = int(time.time() * 1000)
YEAR_1_MS, YEAR_9999_MS = -62135596800000, 253402300799999


def long_text(min_size: int, max_size: int) -> st.SearchStrategy[str]:
    """Long strings cheaply: one character repeated, or a random head repeated."""
    return st.builds(
        lambda head, n: (head * n)[: max(n, min_size)] if head else "",
        st.text(min_size=1, max_size=3),
        st.integers(min_size, max_size),
    )


# Random hex: incompressible, so several long values can outgrow an index entry as real ones do.
RANDOM_HEX = st.builds(lambda n, seed: random.Random(seed).randbytes(n).hex(), st.integers(100, 600), st.integers())
LABEL_VALUE = st.one_of(
    RANDOM_HEX,
    st.sampled_from(["0", "1", "7", "gpu-a-001", "3g.40gb", "llama", "resnet", "", "le", "+Inf", "0.5"]),
    st.sampled_from(UUIDS),
    st.text(max_size=24),  # any character, NUL and quotes and newlines included
    long_text(30, 1100),
)
LABEL_NAME = st.one_of(
    st.sampled_from(
        [
            *("UUID", "uuid", "gpu", "hostname", "Hostname", "modelName", "GPU_I_ID", "GPU_I_PROFILE", "model_name"),
            *("model", "version", "le", "engine", "reason", "gpu_uuid", "pod"),
        ]
    ),
    st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True),
)
VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 61, 612.5, 9223372036854775794, 2147483632, math.nan, math.inf, -math.inf]),
)
TIMESTAMP = st.one_of(
    st.none(),
    st.none(),
    st.integers(NOW_MS - 8 * 86400 * 1000, NOW_MS + 600 * 1000),  # around the window's edges
    st.integers(YEAR_1_MS, YEAR_9999_MS),
    st.sampled_from(["NaN", "+Inf", "1e20", "-1e20"]),
)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_value(value: float | int) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return str(value)


# Strategies are built once, here, not inside each draw: building one (a regex's above all) cost
# more than the request it fed. The same strategies, so the same examples.
ANY_NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,30}", fullmatch=True)
NAME = {False: st.sampled_from(KNOWN_NAMES), True: st.one_of(st.sampled_from(KNOWN_NAMES), ANY_NAME)}
GPU_UUID = {False: st.sampled_from(UUIDS[:2]), True: st.sampled_from(UUIDS)}
GPU_INDEX = {False: st.sampled_from(["0", "1"]), True: st.sampled_from(["0", "1", "x"])}
HOSTNAME = st.sampled_from(["gpu-a-001", "gpu-a-002"])
MIG_ID = {False: st.sampled_from(["1", "5"]), True: st.sampled_from(["1", "5", "99999", "a"])}
VLLM_MODEL = st.sampled_from(["llama", "mistral"])
TRITON_MODEL, TRITON_VERSION = st.sampled_from(["resnet", "bert"]), st.sampled_from(["1", "2"])
ANY_LABELS = st.dictionaries(LABEL_NAME, LABEL_VALUE, max_size=3)
PLAIN_LABELS = st.dictionaries(st.sampled_from(["le", "engine", "pod"]), st.sampled_from(["0", "a b"]))
PLAIN_VALUE = st.one_of(st.floats(0, 1), st.integers(0, 1), st.sampled_from([math.nan, math.inf]))
PLAIN_TIMESTAMP = st.one_of(st.none(), st.integers(NOW_MS - 3600 * 1000, NOW_MS))
ONE_IN_FIVE = st.integers(0, 4)


@st.composite
def sample_line(draw: st.DrawFn, *, chaos: bool) -> str:
    """One sample line: well formed and in range, or (chaos) anything the grammar allows."""
    name = draw(NAME[chaos])
    labels: dict[str, str] = {}
    if name.startswith("DCGM") and (not chaos or draw(st.booleans())):
        uuid = draw(GPU_UUID[chaos])
        labels.update(UUID=uuid, gpu=draw(GPU_INDEX[chaos]))
        labels["hostname"] = draw(HOSTNAME)
        if draw(ONE_IN_FIVE) == 0:
            labels.update(GPU_I_ID=draw(MIG_ID[chaos]), GPU_I_PROFILE="1g.10gb")
    if name.startswith("vllm:") and (not chaos or draw(st.booleans())):
        labels["model_name"] = draw(VLLM_MODEL)
    if name.startswith("nv_inference") and (not chaos or draw(st.booleans())):
        labels.update(model=draw(TRITON_MODEL), version=draw(TRITON_VERSION))
    if chaos:
        labels.update(draw(ANY_LABELS))
        value, stamp = draw(VALUE), draw(TIMESTAMP)
    else:
        labels.update(draw(PLAIN_LABELS))
        value = draw(PLAIN_VALUE)
        stamp = draw(PLAIN_TIMESTAMP)
    rendered = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
    line = f"{name}{{{rendered}}} {render_value(value)}"
    return line if stamp is None else f"{line} {stamp}"


LINE = {False: sample_line(chaos=False), True: sample_line(chaos=True)}
LINE_COUNT, ONE_IN_TWENTY, ONE_IN_TEN, ONE_IN_THIRTY = (
    st.integers(1, 10),
    st.integers(0, 19),
    st.integers(0, 9),
    st.integers(0, 29),
)
ONE_IN_FIFTEEN = st.integers(0, 14)
TYPE_KIND = st.sampled_from(["gauge", "counter", "histogram", "untyped", "summary", "nonsense"])


@st.composite
def exposition(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for _ in range(draw(LINE_COUNT)):
        line = draw(LINE[draw(ONE_IN_TWENTY) == 0])
        if draw(ONE_IN_TEN) == 0:
            name = line.split("{", 1)[0]
            kind = draw(TYPE_KIND)
            lines.append(f"# TYPE {name} {kind}")
        lines.append(line)
        if draw(ONE_IN_THIRTY) == 0:
            lines.append(draw(st.sampled_from(lines)))  # a repeated line: a duplicate series
    body = "\n".join(lines) + "\n"
    if draw(ONE_IN_FIFTEEN) == 0:
        body = body[: draw(st.integers(0, len(body)))]  # cut off mid-way, as a dropped connection
    return body


class _RollBack(Exception):
    pass


def rows_written() -> dict[str, int]:
    return {
        "samples": GpuSample.objects.count(),
        "serving": ServingSample.objects.count(),
        "batches": IngestBatch.objects.count(),
        "gpus": Gpu.objects.count(),
        "nodes": Node.objects.count(),
        "endpoints": Endpoint.objects.count(),
    }


@pytest.mark.django_db
def test_the_prometheus_door_never_5xx_writes_nothing_on_4xx_and_everything_on_202(client, token_a) -> None:
    empty = rows_written()
    assert not any(empty.values())
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )
    @given(
        body=exposition(),
        query=st.sampled_from(["", "?endpoint=tgi-a", "?hostname=gpu-a-009", "?kind=dcgm", "?kind=vllm"]),
        key=st.one_of(st.none(), st.none(), st.text(alphabet="abc-123", max_size=8), st.text(max_size=8)),
    )
    def check(body: str, query: str, key: str | None) -> None:
        directory.clear()  # ids cached in a rolled-back example do not exist
        partitions.forget_known_partitions()
        headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
        try:
            with transaction.atomic():
                response = client.post(
                    f"/api/v1/ingest/prometheus{query}",
                    data=body.encode("utf-8", errors="surrogatepass"),
                    content_type="text/plain; version=0.0.4",
                    HTTP_AUTHORIZATION=f"Bearer {token_a}",
                    **headers,
                )
                assert response.status_code < 500, (response.status_code, response.content, body)
                statuses[response.status_code] += 1
                written = rows_written()
                if response.status_code == 202:
                    counted = response.json()
                    assert written["samples"] == counted["gpu_samples"], (counted, written, body)
                    assert written["serving"] == counted["serving_samples"], (counted, written, body)
                else:
                    assert 400 <= response.status_code < 500
                    assert written == empty, (response.content, written, body)
                raise _RollBack
        except _RollBack:
            pass

    check()
    # Both sides of the property were exercised, not only the refusals.
    print(f"statuses over {EXAMPLES} examples: {dict(statuses)}")
    assert statuses[202] >= EXAMPLES // 10 and sum(n for s, n in statuses.items() if s >= 400) >= EXAMPLES // 10
