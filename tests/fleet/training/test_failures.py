"""Failure reasons classified (fleet/training/failures.py): real messages of each class, the
ambiguous ones by the documented precedence, and the class on the job page's API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import Site
from fleet.training.failures import FABRIC_CLASSES, FailureClass, classify, failure_fields, xid_code
from tests.fleet.training.conftest import post_events, register_job

NCCL_WATCHDOG = (
    "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) "
    "ran for 600060 milliseconds before timing out."
)
NCCL_WATCHDOG_TERMINATED = (
    "terminate called after throwing an instance of 'c10::DistBackendError' what(): [PG 3 Rank 5] Process group "
    "watchdog thread terminated with exception: [Rank 5] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, NumelIn=19008, NumelOut=152064, Timeout(ms)=600000) ran for "
    "600020 milliseconds before timing out."
)
NCCL_REMOTE = (
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
    "remote process exited or there was a network error, NCCL version 2.20.5 ncclRemoteError: A call failed "
    "possibly due to a network error or a remote process exiting prematurely."
)
NCCL_IB = (
    "gpu-a-017:2291:2410 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.0.4.18<52311> "
    "with status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.4.17"
)
NCCL_HEARTBEAT = (
    "[rank7]:[E1014 11:02:31.118 ProcessGroupNCCL.cpp:1375] [PG 0 (default_pg) Rank 7] Heartbeat monitor timed out! "
    "Process will be terminated after dumping debug info. workMetaList_.size()=2"
)
CUDA_ILLEGAL = (
    "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect."
)
CUDA_ASSERT = "RuntimeError: CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable."
CUDA_IN_WATCHDOG = (
    "terminate called after throwing an instance of 'c10::DistBackendError' what(): [PG 0 Rank 2] Process group "
    "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered"
)
NCCL_UNHANDLED_CUDA = (
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3 ncclUnhandledCudaError: "
    "Call to CUDA function failed."
)
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 3 has a total capacity of "
    "79.10 GiB of which 1.15 GiB is free. Including non-PyTorch memory, this process has 77.94 GiB memory in use."
)
TORCH_CUDA_OOM = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.35 GiB total)"
CUDA_ERROR_OOM = "RuntimeError: CUDA error: out of memory"
XLA_OOM = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2.1G."
K8S_OOMKILLED = "container pytorch terminated: OOMKilled (exit code 137)"
SLURM_OOM = (
    "slurmstepd: error: Detected 1 oom_kill event in StepId=4123.0. Some of the step tasks have been OOM Killed."
)
XID_79 = (
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=2290, name=python, GPU has fallen off the bus. NVRM: GPU 0000:3b:00.0: "
    "GPU has fallen off the bus."
)
XID_48 = "XID 48: double-bit ECC error on GPU-7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"
SLURM_PREEMPTED = "slurmstepd: error: *** JOB 48213 ON gpu-a-001 CANCELLED AT 2026-03-02T10:14:07 DUE TO PREEMPTION ***"
K8S_PREEMPTED = "Preempted by pod 1b7c4a2e-5d1f-4c39-9e55-7a0f6b2d9c11 on node gpu-a-001"
KUEUE_PREEMPTED = (
    "Preempted to accommodate a workload (UID: 7f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b, JobUID: 0a1b2c3d) due to "
    "prioritization in the ClusterQueue"
)
K8S_DISRUPTION = "DisruptionTarget: PreemptionByScheduler: Kubernetes Scheduler: preempting"
GCE_PREEMPTED = "Instance was preempted."


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (NCCL_WATCHDOG, FailureClass.NCCL),
        (NCCL_WATCHDOG_TERMINATED, FailureClass.NCCL),
        (NCCL_REMOTE, FailureClass.NCCL),
        (NCCL_IB, FailureClass.NCCL),
        (NCCL_HEARTBEAT, FailureClass.NCCL),
        ("NCCL watchdog timeout", FailureClass.NCCL),
        (CUDA_ILLEGAL, FailureClass.CUDA_ERROR),
        (CUDA_ASSERT, FailureClass.CUDA_ERROR),
        ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered", FailureClass.CUDA_ERROR),
        ("RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx", FailureClass.CUDA_ERROR),
        (TORCH_OOM, FailureClass.OOM),
        (TORCH_CUDA_OOM, FailureClass.OOM),
        (CUDA_ERROR_OOM, FailureClass.OOM),
        (XLA_OOM, FailureClass.OOM),
        (K8S_OOMKILLED, FailureClass.OOM),
        (SLURM_OOM, FailureClass.OOM),
        ("OOM", FailureClass.OOM),
        (XID_79, FailureClass.XID),
        (XID_48, FailureClass.XID),
        ("GPU has fallen off the bus", FailureClass.XID),
        (SLURM_PREEMPTED, FailureClass.PREEMPTION),
        (K8S_PREEMPTED, FailureClass.PREEMPTION),
        (KUEUE_PREEMPTED, FailureClass.PREEMPTION),
        (K8S_DISRUPTION, FailureClass.PREEMPTION),
        (GCE_PREEMPTED, FailureClass.PREEMPTION),
        ("Spot instance interruption notice: the instance will be stopped", FailureClass.PREEMPTION),
    ],
)
def test_real_messages_of_each_class(reason: str, expected: FailureClass) -> None:
    assert classify(reason) == expected


@pytest.mark.parametrize(
    "reason",
    [
        "",
        "Traceback (most recent call last): ValueError: loss is NaN at step 14500",
        "exit code 1",
        "Pod was terminated in response to imminent node shutdown.",  # spot or maintenance: unsaid
        "KeyboardInterrupt",
        "roomy dataset path missing: /data/zoom/shard-0001",  # "oom" inside words is not an OOM
    ],
)
def test_anything_else_is_other(reason: str) -> None:
    assert classify(reason) == FailureClass.OTHER


# --- ambiguous reasons: the cause before its symptoms ------------------------------------------


def test_an_nccl_error_caused_by_an_xid_is_an_xid() -> None:
    """A log tail with the NCCL timeout of the ranks and the driver's XID on the node: the XID is
    the cause, the timeout its symptom."""
    xid_74 = "NVRM: Xid (PCI:0000:9a:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error"
    reason = NCCL_WATCHDOG + "\n" + xid_74
    assert classify(reason) == FailureClass.XID
    assert classify(NCCL_REMOTE + " (Xid 79 on gpu-a-004)") == FailureClass.XID


def test_a_cuda_error_the_watchdog_reports_is_a_cuda_error_not_the_fabric() -> None:
    assert classify(CUDA_IN_WATCHDOG) == FailureClass.CUDA_ERROR
    assert classify(NCCL_UNHANDLED_CUDA) == FailureClass.CUDA_ERROR


def test_a_cuda_error_that_names_an_xid_is_an_xid() -> None:
    assert classify("CUDA error: GPU has fallen off the bus") == FailureClass.XID
    assert classify(CUDA_ILLEGAL + " Xid 31 on GPU 2") == FailureClass.XID


def test_out_of_memory_wins_over_cuda_error_and_nccl() -> None:
    assert classify(CUDA_ERROR_OOM) == FailureClass.OOM
    assert classify("NCCL WARN Cuda failure 'out of memory' in enqueue.cc:1205") == FailureClass.OOM


def test_preemption_wins_over_the_timeouts_it_causes() -> None:
    assert classify(NCCL_WATCHDOG + "\n" + SLURM_PREEMPTED) == FailureClass.PREEMPTION
    assert classify(XID_79 + " " + K8S_PREEMPTED) == FailureClass.PREEMPTION


def test_a_preempted_event_is_a_preemption_whatever_its_reason() -> None:
    assert classify("", kind="preempted") == FailureClass.PREEMPTION
    assert classify(NCCL_WATCHDOG, kind="preempted") == FailureClass.PREEMPTION
    assert classify(NCCL_WATCHDOG, kind="failed") == FailureClass.NCCL


def test_matching_ignores_case() -> None:
    assert classify("nccl timeout on allreduce") == FailureClass.NCCL
    assert classify("cuda out of memory") == FailureClass.OOM
    assert classify("xid 13 graphics engine exception") == FailureClass.XID


def test_only_nccl_is_a_class_a_fabric_fault_explains() -> None:
    assert frozenset({FailureClass.NCCL}) == FABRIC_CLASSES
    assert {c.value for c in FailureClass} == {"nccl", "cuda_error", "oom", "xid", "preemption", "other"}


def test_the_xid_number_is_read_from_the_drivers_line_and_dcgms() -> None:
    assert xid_code(XID_79) == 79
    assert xid_code(XID_48) == 48
    assert xid_code("Xid error 13 on GPU 0") == 13
    assert xid_code(NCCL_WATCHDOG) is None
    assert xid_code("GPU has fallen off the bus") is None


def test_failure_fields_only_for_failures_and_preemptions() -> None:
    assert failure_fields("failed", TORCH_OOM) == {"failure_class": "oom", "failure_class_label": "Out of memory"}
    assert failure_fields("preempted", "")["failure_class"] == "preemption"
    assert failure_fields("restored", "") == {"failure_class": None, "failure_class_label": None}
    assert failure_fields("released", "") == {"failure_class": None, "failure_class_label": None}


# --- on the job page's API ------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_job_snapshot_names_each_failures_class(viewer_client: Client, site_a: Site, token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a, gang_size=8).json()["id"]
    t0 = (timezone.now() - timedelta(hours=1)).replace(second=0, microsecond=0)

    def at(s: float) -> str:
        return (t0 + timedelta(seconds=s)).isoformat()

    events = [
        {"id": "e1", "ts": at(0), "kind": "allocated"},
        {"id": "e2", "ts": at(10), "kind": "started"},
        {"id": "e3", "ts": at(20), "kind": "step", "step": 1, "step_time_s": 10},
        {"id": "e4", "ts": at(30), "kind": "failed", "reason": NCCL_WATCHDOG},
        {"id": "e5", "ts": at(40), "kind": "started"},
        {"id": "e6", "ts": at(50), "kind": "step", "step": 2, "step_time_s": 10},
        {"id": "e7", "ts": at(60), "kind": "failed", "reason": TORCH_OOM},
        {"id": "e8", "ts": at(70), "kind": "started"},
        {"id": "e9", "ts": at(80), "kind": "step", "step": 3, "step_time_s": 10},
        {"id": "e10", "ts": at(90), "kind": "preempted", "reason": "higher-priority job"},
    ]
    assert post_events(client, job_id, events, token_a).status_code == 200
    response = viewer_client.get(f"/api/v1/training/jobs/{job_id}/snapshot")
    assert response.status_code == 200, response.content
    snap = response.json()
    losses = [(loss["kind"], loss["failure_class"], loss["failure_class_label"]) for loss in snap["losses"]]
    assert losses == [
        ("failed", "nccl", "NCCL timeout / watchdog"),
        ("failed", "oom", "Out of memory"),
        ("preempted", "preemption", "Preemption"),
    ]
    # The stored reason is kept as sent, beside its class.
    assert snap["losses"][0]["reason"] == NCCL_WATCHDOG
    # The timeline and the chart markers carry the class of failures only.
    classes = {e["kind"]: e["failure_class"] for e in snap["timeline"] if e["kind"] != "failed"}
    assert classes == {"allocated": None, "started": None, "preempted": "preemption"}
    assert [e["failure_class"] for e in snap["timeline"] if e["kind"] == "failed"] == ["oom", "nccl"]
    assert [m["failure_class"] for m in snap["markers"]["failures"]] == ["nccl", "oom", "preemption"]
