"""What a training job's failure reason says caused it: one pure function over the stored text.

The class is computed from ``JobEvent.reason`` when read (no column): a rule added here re-classifies
every stored failure at once. The patterns come from the messages the software prints:

* NCCL / watchdog: PyTorch's ProcessGroupNCCL watchdog ("[Rank 0] Watchdog caught collective
  operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, ..., Timeout(ms)=600000) ran for
  600060 milliseconds before timing out."), "Process group watchdog thread terminated with
  exception", "Heartbeat monitor timed out", NCCL's own "NCCL error ...: remote process exited or
  there was a network error", "ncclSystemError" / "ncclRemoteError", and its InfiniBand transport
  ("NET/IB : Got completion from peer ... with error 12", "transport retry counter exceeded").
* CUDA error: "CUDA error: an illegal memory access was encountered", "device-side assert
  triggered", "unspecified launch failure", the driver API's CUDA_ERROR_*, NCCL's "unhandled cuda
  error" / ncclUnhandledCudaError, cuBLAS / cuDNN status errors.
* OOM: "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate ...", "CUDA error: out
  of memory", XLA's "RESOURCE_EXHAUSTED: Out of memory", and host memory: Kubernetes' OOMKilled,
  Slurm's "Detected 1 oom_kill event" (both are out of memory; the reason text says which).
* XID: the driver's "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.", DCGM's
  "XID 48", "GPU has fallen off the bus".
* Preemption: Slurm's "*** JOB 1234 ON gpu-a-001 CANCELLED AT ... DUE TO PREEMPTION ***",
  Kubernetes' "Preempted by ... on node ..." and DisruptionTarget reason PreemptionByScheduler,
  Kueue's "Preempted to accommodate a workload ...", a cloud's "Instance was preempted" or spot
  interruption. A ``preempted`` event is a preemption whatever its reason says.

Precedence, when one reason matches several classes (a real log tail often does), the cause before
its symptoms: preemption > XID > OOM > CUDA error > NCCL > other.

* Preemption first: the scheduler took the job; the surviving ranks' NCCL timeouts and SIGTERMs
  that follow are its consequences.
* XID before the rest: a hardware fault the driver reported (XID 79 fallen off the bus, 74 NVLink,
  48 double-bit ECC) surfaces in the job as a CUDA error or, on the other ranks, as an NCCL timeout.
  An NCCL error caused by an XID is an XID.
* OOM before CUDA error: "CUDA error: out of memory" is an out-of-memory.
* CUDA error before NCCL: a local GPU or program fault seen by the NCCL watchdog ("Process group
  watchdog thread terminated with exception: CUDA error: an illegal memory access") or by NCCL
  ("unhandled cuda error") is not a fabric fault.
* NCCL last of the named causes: what is left is a collective that timed out or a transport that
  failed, the class a fabric finding can explain (``FABRIC_CLASSES``).

A node shutting down ("Pod was terminated in response to imminent node shutdown") is ``other``: it
is a spot reclaim on some clouds and maintenance on others, and the reason does not say which.
"""

from __future__ import annotations

import re

from django.db import models


class FailureClass(models.TextChoices):
    NCCL = "nccl", "NCCL timeout / watchdog"
    CUDA_ERROR = "cuda_error", "CUDA error"
    OOM = "oom", "Out of memory"
    XID = "xid", "GPU XID error"
    PREEMPTION = "preemption", "Preemption"
    OTHER = "other", "Other"


# The classes a fabric fault (a flapping link, NVLink errors) can be the cause of: what the
# correlation with the fabric findings reads.
FABRIC_CLASSES = frozenset({FailureClass.NCCL})

_I = re.IGNORECASE
# (class, pattern) in precedence order: the first that matches names the class.
_RULES: tuple[tuple[FailureClass, re.Pattern[str]], ...] = (
    (
        FailureClass.PREEMPTION,
        re.compile(r"preempt|spot (?:instance )?interruption", _I),
    ),
    (
        FailureClass.XID,
        re.compile(r"\bxid\b|fallen off the bus", _I),
    ),
    (
        FailureClass.OOM,
        re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|\boom(?:[-_ ]?kill\w*)?\b", _I),
    ),
    (
        FailureClass.CUDA_ERROR,
        re.compile(
            r"\bcuda error|CUDA_ERROR_|cudaError|unhandled cuda error|device-side assert|illegal memory access"
            r"|unspecified launch failure|CUBLAS_STATUS_|CUDNN_STATUS_",
            _I,
        ),
    ),
    (
        FailureClass.NCCL,
        re.compile(
            r"nccl|watchdog|collective operation timeout|heartbeat monitor timed out|NET/IB\b"
            r"|transport retry counter exceeded|IBV_WC_",
            _I,
        ),
    ),
)

# The XID number in the driver's line ("NVRM: Xid (PCI:0000:3b:00): 79, pid=...") or DCGM's
# ("XID 79", "Xid error 48").
_XID_CODE = re.compile(r"\bxid\b(?:\s*\([^)]*\))?(?:\s*error)?\s*:?\s*(\d{1,5})\b", _I)


def classify(reason: str, *, kind: str = "failed") -> FailureClass:
    """The class of a failure from its reason text (``kind`` the event's: a ``preempted`` event is
    a preemption whatever it says). Empty or unrecognised text is OTHER."""
    if kind == "preempted":
        return FailureClass.PREEMPTION
    for cls, pattern in _RULES:
        if pattern.search(reason or ""):
            return cls
    return FailureClass.OTHER


def xid_code(reason: str) -> int | None:
    """The XID number a reason names, if it names one."""
    match = _XID_CODE.search(reason or "")
    return int(match.group(1)) if match else None


def failure_fields(kind: str, reason: str) -> dict[str, str | None]:
    """The class of a failed or preempted event as the page and the API show it beside the reason
    (``failure_class``, ``failure_class_label``); None for events of other kinds."""
    if kind not in ("failed", "preempted"):
        return {"failure_class": None, "failure_class_label": None}
    cls = classify(reason, kind=kind)
    return {"failure_class": cls.value, "failure_class_label": cls.label}
