"""The training client: a whole run over real HTTP into PostgreSQL; the remote-write delivery
rules against a small scripted console; the buffer's drop policy; the step timer; and the
Hugging Face and Lightning callbacks driven by stand-ins (neither library is installed here,
which is the point: the module imports without them)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from clients import training_client
from clients.training_client import (
    GoodputTrainingClient,
    HuggingFaceGoodputCallback,
    LightningGoodputCallback,
    clean_reason,
    default_node_name,
)
from fleet.models import Job, JobEvent, Node, Site

ROOT = Path(__file__).resolve().parents[3]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition (the sender is a background thread); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        time.sleep(0.01)


# --- a scripted console -----------------------------------------------------------------------


@dataclass
class FakeConsole:
    """Answers registration with job 7 (in the state and with the last step of ``job``, as the
    jobs API does) and event batches with the next scripted (status, headers, body) reply (200
    once the script runs out), recording every event batch it is sent."""

    url: str = ""
    job: dict[str, Any] = field(default_factory=lambda: {"state": "pending", "last_step": None})
    replies: list[tuple[int, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    batches: list[list[dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        with self.lock:
            if path == "/api/v1/training/jobs/":
                return 201, {}, {"id": 7, **body, **self.job}
            assert path == "/api/v1/training/jobs/7/events", path
            self.batches.append(body["events"])
            if self.replies:
                return self.replies.pop(0)
            return 200, {}, {"written": len(body["events"]), "repeated": 0, "state": "running"}

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for batch in self.batches for e in batch]


@pytest.fixture
def console() -> Iterator[FakeConsole]:
    fake = FakeConsole()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            assert self.headers["Authorization"] == "Bearer secret"
            status, headers, body = fake.answer(self.path, json.loads(self.rfile.read(length)))
            payload = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


def make_client(url: str, token: str = "secret", **options: Any) -> GoodputTrainingClient:
    defaults: dict[str, Any] = {
        "name": "llama-8b",
        "team": "foundation",
        "gang_size": 16,
        "scheduler": "slurm",
        "scheduler_id": "4242",
        "nodes": ["gpu-a-001", "gpu-a-002"],
        "checkpoint_interval_s": 1800,
        "flush_interval_s": 0.05,
        "backoff_s": 0.01,
    }
    return GoodputTrainingClient(url, token, **{**defaults, **options})


class FakeClock:
    """Stands in for time.perf_counter: returns the times the test sets."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(training_client, "_clock", fake)
    return fake


# --- the real console ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_whole_run_is_stored_in_order_and_once(live_server: Any, token_a: str, site_a: Site) -> None:
    # The console links a job to nodes of its fleet only (it creates none).
    Node.objects.create(site=site_a, hostname="gpu-a-001")
    Node.objects.create(site=site_a, hostname="gpu-a-002")
    client = make_client(live_server.url, token_a, max_batch=3)
    job_id = client.register()
    client.allocated()
    client.started()
    for n in (1, 2, 3, 4):
        client.step(n, step_time_s=1.5, data_wait_s=0.25, tokens=4096, node="gpu-a-001")
    client.checkpoint_saved(4, duration_s=12.0, bytes=10**9)
    with client.timed_step(5, tokens=4096) as timer:
        timer.data_ready()
    client.completed(step=5)
    assert client.close(timeout=20)

    rows = list(JobEvent.objects.filter(job_id=job_id).order_by("seq"))
    kinds = [r.kind for r in rows]
    assert kinds == ["allocated", "started", "step", "step", "step", "step", "checkpoint_saved", "step", "completed"]
    assert [r.seq for r in rows] == list(range(9))  # 9 events, in batches of at most 3, each stored once
    assert len({r.event_id for r in rows}) == 9
    assert all(r.event_id.startswith(client.run_id + "-") for r in rows)
    assert [r.ts for r in rows] == sorted(r.ts for r in rows)
    step_4 = rows[5]
    assert (step_4.step, step_4.step_time_s, step_4.data_wait_s, step_4.tokens, step_4.node) == (
        4,
        1.5,
        0.25,
        4096,
        "gpu-a-001",
    )
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.last_step, job.last_checkpoint_step, job.gang_size) == ("completed", 5, 4, 16)
    assert sorted(job.nodes.values_list("hostname", flat=True)) == ["gpu-a-001", "gpu-a-002"]
    assert client.sent_events == 9 and client.rejected_batches == 0


@pytest.mark.django_db(transaction=True)
def test_a_restarted_script_finds_its_job_and_never_reuses_an_event_id(live_server: Any, token_a: str) -> None:
    first = make_client(live_server.url, token_a)
    job_id = first.register()
    first.allocated()
    first.started()
    first.step(1, step_time_s=1.0)
    first.failed("NCCL watchdog timeout")
    assert first.close(timeout=20)

    second = make_client(live_server.url, token_a)  # same scheduler id: the same job
    assert second.register() == job_id
    second.started()
    second.restored(0, duration_s=30.0)
    second.step(1, step_time_s=1.0)
    assert second.close(timeout=20)

    rows = list(JobEvent.objects.filter(job_id=job_id).order_by("seq"))
    assert [r.kind for r in rows] == ["allocated", "started", "step", "failed", "started", "restored", "step"]
    assert len({r.event_id for r in rows}) == 7  # both runs numbered from 1, yet no id collides
    assert first.run_id != second.run_id
    assert Job.objects.get(pk=job_id).state == "running"


@pytest.mark.django_db(transaction=True)
def test_a_rerun_from_scratch_sends_restored_0_so_its_steps_are_stored(live_server: Any, token_a: str) -> None:
    first = make_client(live_server.url, token_a)
    job_id = first.register()
    assert (first.job_state, first.stored_last_step) == ("pending", None)
    first.allocated()
    first.started(resume_step=0)  # a new job: nothing to go back from, so no restore
    for n in (1, 2, 3):
        first.step(n, step_time_s=1.0)
    first.failed("XID 79")
    assert first.close(timeout=20)

    second = make_client(live_server.url, token_a)  # the scheduler reruns it from scratch
    assert second.register() == job_id
    assert (second.job_state, second.stored_last_step) == ("failed", 3)  # from the jobs API's answer
    second.allocated()
    second.started()
    second.begin_run(0)  # docs/training.md's plain loop: from scratch
    second.step(1, step_time_s=1.0)  # behind the stored step 3: accepted only after the restore
    second.step(2, step_time_s=1.0)
    second.completed(step=2)
    assert second.close(timeout=20)

    rows = list(JobEvent.objects.filter(job_id=job_id).order_by("seq"))
    assert [(r.kind, r.step) for r in rows] == [
        ("allocated", None),
        ("started", None),
        ("step", 1),
        ("step", 2),
        ("step", 3),
        ("failed", None),
        ("allocated", None),
        ("started", None),
        ("restored", 0),
        ("step", 1),
        ("step", 2),
        ("completed", 2),
    ]
    assert (first.rejected_events, second.rejected_events) == (0, 0)
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.last_step) == ("completed", 2)


@pytest.mark.django_db(transaction=True)
def test_the_real_console_refuses_one_event_and_the_rest_of_its_batch_is_stored(
    live_server: Any, token_a: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(live_server.url, token_a, flush_interval_s=3600)
    job_id = client.register()
    client.allocated()
    client.started()
    client.step(1, step_time_s=1.0)
    client.step(2, step_time_s=1.0, data_wait_s=5.0)  # events[3]: more data wait than step: refused
    client.step(3, step_time_s=1.0)
    client.completed(step=3)
    assert client.close(timeout=20)  # one batch of 6; refused, resent without events[3], stored

    rows = list(JobEvent.objects.filter(job_id=job_id).order_by("seq"))
    assert [(r.kind, r.step) for r in rows] == [
        ("allocated", None),
        ("started", None),
        ("step", 1),
        ("step", 3),
        ("completed", 3),
    ]
    assert (client.sent_events, client.rejected_events, client.rejected_batches) == (5, 1, 0)
    assert f"events[3] (id '{client.run_id}-4').data_wait_s" in caplog.text  # the console's words
    assert Job.objects.get(pk=job_id).state == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_reason_the_console_would_refuse_is_cleaned_and_stored(live_server: Any, token_a: str) -> None:
    client = make_client(live_server.url, token_a)
    job_id = client.register()
    client.allocated()
    client.started()
    # An exception's text can hold a NUL, a lone surrogate (a path decoded with surrogateescape)
    # and be long; the console refuses all three (a lone surrogate makes the whole JSON invalid).
    client.failed(RuntimeError("CUDA error\x00: cannot open /data/\udc80.bin " + "x" * 700))
    client.preempted("node drained\x00 by the scheduler")
    assert client.close(timeout=20)

    rows = list(JobEvent.objects.filter(job_id=job_id).order_by("seq"))
    assert [r.kind for r in rows] == ["allocated", "started", "failed", "preempted"]
    head = "CUDA error: cannot open /data/?.bin "  # NUL gone, the surrogate replaced: 36 characters
    assert rows[2].reason == head + "x" * (500 - len(head))  # cut at 500 characters: 36 + 464 x
    assert len(rows[2].reason) == 500
    assert rows[3].reason == "node drained by the scheduler"
    assert client.rejected_events == 0


def test_clean_reason_keeps_clean_text_as_it_is() -> None:
    assert clean_reason("NCCL watchdog timeout") == "NCCL watchdog timeout"
    assert clean_reason(ValueError("é 中 🙂")) == "é 中 🙂"  # real non-ASCII text is kept
    assert clean_reason("\x00" * 600) == ""
    assert len(clean_reason("y" * 501)) == 500


# --- the node a job runs on -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"NODE_NAME": "gpu-k8s-017", "SLURMD_NODENAME": "gpu-slurm-003"}, "gpu-k8s-017"),  # Kubernetes
        ({"SLURMD_NODENAME": "gpu-slurm-003"}, "gpu-slurm-003"),  # Slurm
        ({"NODE_NAME": "  "}, None),  # blank: not set
        ({}, None),  # bare metal: this machine's hostname
    ],
)
def test_the_default_node_is_the_kubernetes_node_then_the_slurm_node_then_the_hostname(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], expected: str | None
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "trainer-pod-7f9c")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    want = expected or "trainer-pod-7f9c"
    assert default_node_name() == want
    assert make_client("http://console", nodes=None).job_fields["nodes"] == [want]
    assert make_client("http://console", nodes=["gpu-a-009"]).job_fields["nodes"] == ["gpu-a-009"]  # given: kept


@pytest.mark.django_db(transaction=True)
def test_in_a_pod_the_job_is_linked_to_the_node_named_by_node_name(
    live_server: Any, token_a: str, site_a: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    Node.objects.create(site=site_a, hostname="gpu-a-017")
    monkeypatch.setenv("NODE_NAME", "gpu-a-017")  # the downward API's spec.nodeName
    monkeypatch.setattr(socket, "gethostname", lambda: "llama-8b-worker-0")  # the pod's name
    client = make_client(live_server.url, token_a, nodes=None)
    job_id = client.register()
    client.close()
    assert list(Job.objects.get(pk=job_id).nodes.values_list("hostname", flat=True)) == ["gpu-a-017"]
    assert not Node.objects.filter(hostname="llama-8b-worker-0").exists()


# --- delivery rules -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [503, 429])
def test_a_retryable_answer_resends_the_same_batch(console: FakeConsole, status: int) -> None:
    console.replies = [(status, {"Retry-After": "0"}, {"error": "queue full"})]
    client = make_client(console.url)
    client.register()
    client.allocated()
    client.started()
    client.step(1, step_time_s=2.0)
    assert client.close(timeout=10)
    assert len(console.batches) == 2
    assert console.batches[0] == console.batches[1]  # same events, same ids, same times
    assert [e["kind"] for e in console.batches[1]] == ["allocated", "started", "step"]


def test_a_400_drops_only_the_event_it_names_and_resends_the_rest(
    console: FakeConsole, caplog: pytest.LogCaptureFixture
) -> None:
    message = "events[3] (id 'x-4').step: step 1 is behind step 3 without a restore in between."
    console.replies = [(400, {}, {"error": message, "item": 3, "field": "step"})]
    client = make_client(console.url, flush_interval_s=3600)
    client.register()
    client.allocated()
    client.started()
    client.step(3, step_time_s=1.0)
    client.step(1, step_time_s=1.0)
    assert client.flush(timeout=10)
    first, second = console.batches
    assert [(e["kind"], e.get("step")) for e in first] == [
        ("allocated", None),
        ("started", None),
        ("step", 3),
        ("step", 1),
    ]
    assert second == first[:3]  # the same events, ids and times, less the refused one
    assert (client.sent_events, client.rejected_events, client.rejected_batches) == (3, 1, 0)
    assert message in caplog.text  # the console's words, naming the event and field, reach the log
    assert first[3]["id"] in caplog.text  # and the dropped event's id
    client.close()


def test_a_batch_refused_round_after_round_is_dropped_after_max_refusals(console: FakeConsole) -> None:
    console.replies = [(400, {}, {"error": "refused", "item": 0, "field": "step"})] * 3
    client = make_client(console.url, flush_interval_s=3600, max_refusals=2)
    client.register()
    client.allocated()
    for n in (1, 2, 3, 4):
        client.step(n, step_time_s=1.0)
    assert client.flush(timeout=10)
    # Round 1 drops the allocated event, round 2 step 1; the third refusal is past max_refusals
    # (2): the 3 events left are dropped together.
    assert [len(batch) for batch in console.batches] == [5, 4, 3]
    assert (client.sent_events, client.rejected_events, client.rejected_batches) == (0, 5, 1)
    client.released()  # the sender goes on with the next batch
    assert client.close(timeout=10)
    assert [e["kind"] for e in console.batches[-1]] == ["released"]
    assert client.sent_events == 1


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, {"error": "Malformed JSON: invalid utf-16 surrogate pair"}),  # no event named
        (400, {"error": "events[9]: out of this batch", "item": 9}),  # an index the batch lacks
        (404, {"error": "No job 7.", "item": 0}),  # not a 400: no event is at fault
    ],
)
def test_a_refusal_that_names_no_event_of_the_batch_drops_the_batch(
    console: FakeConsole, status: int, body: dict[str, Any]
) -> None:
    console.replies = [(status, {}, body)]
    client = make_client(console.url, flush_interval_s=3600)
    client.register()
    client.allocated()
    client.started()
    assert client.flush(timeout=10)
    client.released()
    assert client.close(timeout=10)
    assert [[e["kind"] for e in batch] for batch in console.batches] == [["allocated", "started"], ["released"]]
    assert (client.sent_events, client.rejected_events, client.rejected_batches) == (1, 2, 1)


def test_an_unreachable_console_is_retried_until_close_gives_up() -> None:
    client = make_client("http://127.0.0.1:9", flush_interval_s=0.01)  # the discard port: refused
    client.job_id = 7  # as if registered before the console went away
    client.allocated()
    started = time.monotonic()
    assert client.close(timeout=0.5) is False
    assert time.monotonic() - started < 5
    assert client.pending() == 1


def test_a_full_buffer_drops_the_oldest_steps_and_never_a_lifecycle_event(console: FakeConsole) -> None:
    client = make_client(console.url, max_batch=2, max_buffer=4)
    # Not registered yet: everything waits in the buffer.
    client.allocated()
    client.started()
    client.step(1, step_time_s=1.0)
    client.step(2, step_time_s=1.0)  # full: [allocated, started, 1, 2]
    client.step(3, step_time_s=1.0)  # drops 1 -> [allocated, started, 2, 3]
    client.checkpoint_saved(3, duration_s=5.0)  # drops 2 -> [allocated, started, 3, ckpt]
    client.step(4, step_time_s=1.0)  # drops 3 -> [allocated, started, ckpt, 4]
    client.failed("XID 79")  # drops 4 -> [allocated, started, ckpt, failed]
    client.released()  # no step left to drop: the buffer grows to 5
    assert client.dropped_steps == 4
    assert client.pending() == 5
    client.register()
    assert client.close(timeout=10)
    assert [e["kind"] for e in console.events()] == ["allocated", "started", "checkpoint_saved", "failed", "released"]
    ids = [int(e["id"].rsplit("-", 1)[1]) for e in console.events()]
    assert ids == [1, 2, 6, 8, 9]  # the sequence numbers of the kept events, in order


def test_flush_sends_what_is_buffered_without_waiting_for_the_interval(console: FakeConsole) -> None:
    client = make_client(console.url, flush_interval_s=3600)
    client.register()
    client.allocated()
    assert client.flush(timeout=10)
    assert [e["kind"] for e in console.events()] == ["allocated"]
    client.close()


@pytest.mark.parametrize(
    ("stored_last_step", "resume_step", "expected"),
    [
        (40, 0, [("started", None), ("restored", 0), ("step", 1)]),  # a rerun from scratch
        (40, 30, [("started", None), ("restored", 30), ("step", 1)]),  # from the checkpoint of step 30
        (None, 0, [("started", None), ("step", 1)]),  # a new job: nothing to go back from
        (None, 30, [("started", None), ("step", 1)]),  # no step stored: the console has no checkpoint 30
    ],
)
def test_started_with_resume_step_restores_only_when_the_job_has_stored_steps(
    console: FakeConsole, stored_last_step: int | None, resume_step: int, expected: list[tuple[str, int | None]]
) -> None:
    console.job = {"state": "failed", "last_step": stored_last_step}
    client = make_client(console.url)
    client.register()
    assert client.stored_last_step == stored_last_step
    client.started(resume_step=resume_step)
    client.step(1, step_time_s=1.0)  # the step numbering here is the test's, not the resume's
    assert client.close(timeout=10)
    assert [(e["kind"], e.get("step")) for e in console.events()] == expected


def test_a_restore_of_an_in_process_restart_uses_the_steps_recorded_here(console: FakeConsole) -> None:
    client = make_client(console.url)
    client.register()  # a new job: no stored step
    client.allocated()
    client.started(resume_step=0)
    client.step(1, step_time_s=1.0)
    client.failed("NCCL error")
    client.started()
    client.begin_run(0, restore_duration_s=4.0)  # step 1 was recorded here: go back to 0, 4 s to load
    client.step(1, step_time_s=1.0)
    assert client.close(timeout=10)
    kinds = [(e["kind"], e.get("step"), e.get("duration_s")) for e in console.events()]
    assert kinds[4:6] == [("started", None, None), ("restored", 0, 4.0)]


def test_a_step_behind_the_stored_ones_without_a_restore_is_warned_about_once(
    console: FakeConsole, caplog: pytest.LogCaptureFixture
) -> None:
    console.job = {"state": "running", "last_step": 40}
    client = make_client(console.url)
    client.register()
    with caplog.at_level(logging.WARNING, logger="goodput.training_client"):
        client.started()  # no resume_step and no begin_run(): the console refuses steps below 40
        client.step(1, step_time_s=1.0)
        client.step(2, step_time_s=1.0)
    warnings = [r.getMessage() for r in caplog.records if "is behind the job's step" in r.getMessage()]
    assert warnings == [
        "step 1 is behind the job's step 40: the console refuses it without a restore; "
        "call begin_run(<the step this run resumes from, 0 from scratch>) before the first step"
    ]
    client.close()


# --- the step timer -----------------------------------------------------------------------------


def test_timed_step_measures_the_step_and_its_data_wait(console: FakeConsole, clock: FakeClock) -> None:
    client = make_client(console.url)
    with client.timed_step(10, tokens=2048, node="gpu-a-001") as timer:
        clock.now += 0.25  # waiting for the batch
        timer.data_ready()
        clock.now += 0.75  # forward, backward, optimizer step
    with pytest.raises(RuntimeError), client.timed_step(11):
        raise RuntimeError("CUDA error")  # an unfinished step is no progress: nothing recorded
    client.register()
    assert client.close(timeout=10)
    (event,) = console.events()
    assert (event["kind"], event["step"], event["tokens"], event["node"]) == ("step", 10, 2048, "gpu-a-001")
    assert event["step_time_s"] == pytest.approx(1.0)  # 0.25 + 0.75
    assert event["data_wait_s"] == pytest.approx(0.25)


# --- callbacks ------------------------------------------------------------------------------------


def test_the_module_imports_without_django_torch_transformers_or_lightning() -> None:
    code = (
        "import sys\n"
        "for name in ('django', 'torch', 'transformers', 'lightning', 'pytorch_lightning', 'requests'):\n"
        "    sys.modules[name] = None  # any import of them raises ImportError\n"
        "import clients.training_client as c\n"
        "assert c.HuggingFaceGoodputCallback.__mro__[1] is object\n"
        "assert c.LightningGoodputCallback.__mro__[1] is object\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_hugging_face_callback_reports_a_resumed_run(console: FakeConsole, clock: FakeClock) -> None:
    console.job = {"state": "failed", "last_step": 120}  # failed at step 120; its checkpoint of 100 is loaded
    client = make_client(console.url, framework="huggingface")
    callback = HuggingFaceGoodputCallback(client)
    args = SimpleNamespace(include_num_input_tokens_seen=True)
    # The Trainer loaded step 100 from a checkpoint before on_train_begin.
    state = SimpleNamespace(global_step=100, is_world_process_zero=True, num_input_tokens_seen=409_600)
    control = SimpleNamespace()
    callback.on_train_begin(args, state, control)  # registers, allocated, started, restored(100)
    for seconds in (2.0, 3.0):
        callback.on_step_begin(args, state, control)
        clock.now += seconds
        state.global_step += 1
        state.num_input_tokens_seen += 4096
        callback.on_step_end(args, state, control)
    clock.now += 1.0  # evaluation: not part of the save
    callback.on_evaluate(args, state, control, metrics={})
    clock.now += 8.0  # the checkpoint is written
    callback.on_save(args, state, control)
    callback.on_train_end(args, state, control)  # completed, and flushed
    assert client.job_id == 7
    events = console.events()
    assert [e["kind"] for e in events] == [
        "allocated",
        "started",
        "restored",
        "step",
        "step",
        "checkpoint_saved",
        "completed",
    ]
    assert events[2]["step"] == 100
    assert [(e["step"], e["step_time_s"], e["tokens"]) for e in events[3:5]] == [(101, 2.0, 4096), (102, 3.0, 4096)]
    assert (events[5]["step"], events[5]["duration_s"]) == (102, 8.0)
    assert events[6]["step"] == 102
    client.close()


@pytest.mark.parametrize(
    ("stored_last_step", "restored"),
    [(40, [("restored", 0)]), (None, [])],  # a job with stored steps goes back to 0; a new one need not
)
def test_the_hugging_face_callback_run_from_scratch(
    console: FakeConsole, clock: FakeClock, stored_last_step: int | None, restored: list[tuple[str, int]]
) -> None:
    console.job = {"state": "failed", "last_step": stored_last_step}
    client = make_client(console.url, framework="huggingface")
    callback = HuggingFaceGoodputCallback(client, tokens_per_step=1024)
    args, control = SimpleNamespace(), SimpleNamespace()
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    callback.on_train_begin(args, state, control)
    callback.on_step_begin(args, state, control)
    clock.now += 1.0
    state.global_step = 1
    callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)
    kinds = [(e["kind"], e.get("step")) for e in console.events()]
    assert kinds == [("allocated", None), ("started", None), *restored, ("step", 1), ("completed", 1)]
    client.close()


def test_the_hugging_face_callback_is_silent_off_process_zero(console: FakeConsole) -> None:
    client = make_client(console.url)
    callback = HuggingFaceGoodputCallback(client)
    state = SimpleNamespace(global_step=0, is_world_process_zero=False)
    args, control = SimpleNamespace(), SimpleNamespace()
    callback.on_train_begin(args, state, control)
    callback.on_step_begin(args, state, control)
    state.global_step = 1
    callback.on_step_end(args, state, control)
    callback.on_save(args, state, control)
    callback.on_train_end(args, state, control)
    assert client.job_id is None and client.pending() == 0
    client.close()


def test_the_lightning_callback_reports_steps_a_checkpoint_and_a_failure(
    console: FakeConsole, clock: FakeClock
) -> None:
    client = make_client(console.url, framework="lightning")
    callback = LightningGoodputCallback(client, tokens_per_step=8192)
    trainer = SimpleNamespace(is_global_zero=True, global_step=0, ckpt_path=None)
    module = object()
    callback.on_train_start(trainer, module)  # registers, allocated, started (no ckpt_path: fresh)
    callback.on_train_batch_start(trainer, module, batch=None, batch_idx=0)
    clock.now += 1.5
    trainer.global_step = 1
    callback.on_train_batch_end(trainer, module, outputs=None, batch=None, batch_idx=0)
    callback.on_save_checkpoint(trainer, module, checkpoint={})  # checkpoint_started(1)
    clock.now += 6.0  # the checkpoint file is written
    callback.on_train_batch_start(trainer, module, batch=None, batch_idx=1)  # checkpoint_saved(1, 6 s)
    clock.now += 0.5
    callback.on_exception(trainer, module, RuntimeError("NCCL communicator aborted"))  # failed, flushed
    events = console.events()
    assert [e["kind"] for e in events] == [
        "allocated",
        "started",
        "step",
        "checkpoint_started",
        "checkpoint_saved",
        "failed",
    ]
    assert (events[2]["step"], events[2]["step_time_s"], events[2]["tokens"]) == (1, 1.5, 8192)
    assert events[3]["step"] == 1
    assert (events[4]["step"], events[4]["duration_s"]) == (1, 6.0)
    assert events[5]["reason"] == "RuntimeError: NCCL communicator aborted"
    client.close()


def test_the_lightning_callback_reports_a_restore_and_completion(console: FakeConsole, clock: FakeClock) -> None:
    console.job = {"state": "preempted", "last_step": 530}  # preempted at 530, resumed from checkpoint 500
    client = make_client(console.url, framework="lightning")
    callback = LightningGoodputCallback(client)
    trainer = SimpleNamespace(is_global_zero=True, global_step=500, ckpt_path="/ckpt/step-500.ckpt")
    callback.on_train_start(trainer, None)
    callback.on_train_batch_start(trainer, None, None, 0)
    clock.now += 2.0
    trainer.global_step = 501
    callback.on_train_batch_end(trainer, None, None, None, 0)
    callback.on_train_end(trainer, None)
    events = console.events()
    assert [(e["kind"], e.get("step")) for e in events] == [
        ("allocated", None),
        ("started", None),
        ("restored", 500),
        ("step", 501),
        ("completed", 501),
    ]
    assert "tokens" not in events[3]  # not told: not sent
    client.close()


def test_the_lightning_callback_restores_step_0_when_a_job_with_stored_steps_runs_from_scratch(
    console: FakeConsole, clock: FakeClock
) -> None:
    console.job = {"state": "failed", "last_step": 12}
    client = make_client(console.url, framework="lightning")
    callback = LightningGoodputCallback(client)
    trainer = SimpleNamespace(is_global_zero=True, global_step=0, ckpt_path=None)
    callback.on_train_start(trainer, None)
    callback.on_train_batch_start(trainer, None, None, 0)
    clock.now += 1.0
    trainer.global_step = 1
    callback.on_train_batch_end(trainer, None, None, None, 0)
    callback.on_train_end(trainer, None)
    assert [(e["kind"], e.get("step")) for e in console.events()] == [
        ("allocated", None),
        ("started", None),
        ("restored", 0),  # so step 1, behind the stored step 12, is accepted
        ("step", 1),
        ("completed", 1),
    ]
    client.close()
