"""The scheduler series the Prometheus door maps (this room's entries in fleet.exporters), by
exposed name: Kueue's controller metrics, kube-state-metrics and a Slurm exporter. Names, labels and
types as each project defines them (checked against Kueue v0.19.2, kube-state-metrics v2.20.0 and
prometheus-slurm-exporter 0.20):

- Kueue: site/content/en/docs/reference/metrics.md ("Prometheus Metrics") and
  pkg/metrics/metrics.go. Since v0.16 every series carries ``replica_role`` (leader, follower,
  standalone); a follower's series are ignored (the leader's are the scheduler's).
  ``priority_class`` (on the admitted and evicted counters and the wait histogram since v0.14) is
  kept so that each class's counters reset on their own. The wait histogram's bounds are 1 s
  then 2.5 s doubling (16 bounds to 40960 s since v0.17, 14 before). The resource gauges need
  ``metrics.enableClusterQueueResources``; ``cohort`` is empty for a ClusterQueue without one,
  and an unset borrowing or lending limit is reported as +Inf (kept: it means "no limit").
- kube-state-metrics: docs/metrics/workload/pod-metrics.md, docs/metrics/cluster/node-metrics.md
  and docs/metrics/policy/resourcequota-metrics.md (internal/store/pod.go, node.go,
  resourcequota.go). Pod gauges are summed per namespace (pods per phase, unschedulable pods,
  pods by scheduled condition, GPUs requested per node); restarts stay per pod and container (a
  counter per series). A node's cordon (``kube_node_spec_unschedulable{node}``, a gauge of 1 or 0)
  stays per node, the cluster's own series. Resource names are sanitised in requests and allocatable
  (``nvidia_com_gpu``) but not in ``kube_resourcequota`` (``requests.nvidia.com/gpu``).
- Slurm: vpenso/prometheus-slurm-exporter (README.md; nodes.go, gpus.go, queue.go,
  partitions.go): node, GPU and job counts for the whole cluster, without labels, and per
  ``partition`` pending jobs and CPUs. A partition series is printed only while its value is
  above zero (partitions.go), so a partition's pending jobs fall to zero by vanishing. The GPU
  series need ``-gpus-acct``; ``slurm_gpus_other`` is printed by the development branch only
  (release 0.20 prints alloc, idle = total - alloc, total and utilization). Per partition the
  exporter itself prints CPUs and pending jobs only: running jobs and GPUs per partition
  (``slurm_partition_jobs_running``, ``slurm_partition_gpus_*``) are printed by forks (SckyzO's,
  and others' partition_gpus.go), not by vpenso's, and are not mapped. Other exporters (rivosinc,
  SckyzO) name these differently and are not mapped.
- Kueue's LocalQueues (feature gate ``LocalQueueMetrics``; the same reference): pending (per
  ``status``), reserving and admitted active workloads, admitted workloads (per
  ``priority_class``) and resource usage (per ``flavor`` and ``resource``, no cohort), each
  labelled ``name`` and ``namespace``; registered as the LocalQueue ``namespace/name``.
- Slurm accounts (vpenso's accounts.go, from ``squeue``): jobs pending, running and suspended,
  CPUs and GPUs pending and running, per ``account``; like a partition's, an account's series
  is printed only while above zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fleet.choices import QueueKind, QueueScheduler
from fleet.exporters import QUEUE, ExporterMapping
from fleet.scheduler.store import store_queue_points

KUEUE, SLURM, KUBERNETES = QueueScheduler.KUEUE, QueueScheduler.SLURM, QueueScheduler.KUBERNETES


@dataclass(frozen=True)
class QueueSeries:
    """How one exposed name becomes a queue series."""

    scheduler: str
    quantity: str
    queue_label: str | None  # the label naming the queue; None: the cluster's own series
    keep: tuple[str, ...] = ()  # labels kept in the series text (the rest: instance, uid, unit...)
    required: tuple[str, ...] = ()  # labels the exporter always exports: refused without
    fixed: tuple[tuple[str, str], ...] = ()  # labels the name itself implies (Slurm's node state)
    only: Callable[[dict[str, str]], bool] | None = field(default=None, compare=False)  # else ignored
    summed: bool = False  # a gauge summed per queue over the labels dropped (pods of a namespace)
    unlimited: bool = False  # +Inf is a value (an unset limit), not an unreadable one
    histogram: bool = False  # a part of a histogram: ignored whole when any part cannot be read
    kind: str = ""  # fleet.choices.QueueKind where not the scheduler's own queue (a LocalQueue, an account)
    namespace_label: str | None = None  # a namespaced queue (a LocalQueue): registered as namespace/name

    def queue_of(self, labels: dict[str, str]) -> str:
        """The queue's name as registered: blank for the cluster's own series, ``namespace/name``
        for a namespaced one."""
        if not self.queue_label:
            return ""
        if self.namespace_label:
            return f"{labels[self.namespace_label]}/{labels[self.queue_label]}"
        return labels[self.queue_label]


def _gpu(labels: dict[str, str]) -> bool:
    return labels.get("resource") == "nvidia_com_gpu"  # kube-state-metrics sanitises the resource name


def _gpu_quota(labels: dict[str, str]) -> bool:
    # A quota on an extended resource takes only the requests. prefix (Kubernetes, "Resource Quotas").
    return labels.get("resource") == "requests.nvidia.com/gpu"


_CQ = "cluster_queue"
_RESOURCE = ("flavor", "resource")


def _local_queue(quantity: str, keep: tuple[str, ...] = (), required: tuple[str, ...] = ()) -> QueueSeries:
    """A Kueue LocalQueue series: ``name`` and ``namespace`` name the queue."""
    return QueueSeries(
        KUEUE,
        quantity,
        "name",
        keep,
        ("namespace", *required),
        kind=QueueKind.LOCAL_QUEUE,
        namespace_label="namespace",
    )


def _account(quantity: str, state: str) -> QueueSeries:
    """A Slurm account series: its jobs, CPUs or GPUs in one state."""
    return QueueSeries(SLURM, quantity, "account", fixed=(("state", state),), kind=QueueKind.ACCOUNT)


SCHEDULER_SERIES: dict[str, QueueSeries] = {
    # Kueue, per ClusterQueue
    "kueue_pending_workloads": QueueSeries(KUEUE, "pending_workloads", _CQ, ("status",), ("status",)),
    "kueue_reserving_active_workloads": QueueSeries(KUEUE, "reserving_active_workloads", _CQ),
    "kueue_admitted_active_workloads": QueueSeries(KUEUE, "admitted_active_workloads", _CQ),
    "kueue_admitted_workloads_total": QueueSeries(KUEUE, "admitted_workloads", _CQ, ("priority_class",)),
    "kueue_evicted_workloads_total": QueueSeries(
        KUEUE, "evicted_workloads", _CQ, ("reason", "underlying_cause", "priority_class"), ("reason",)
    ),
    # Filed under the ClusterQueue whose workload preempted (Kueue labels no target here).
    "kueue_preempted_workloads_total": QueueSeries(
        KUEUE, "preempted_workloads", "preempting_cluster_queue", ("reason",), ("reason",)
    ),
    "kueue_admission_wait_time_seconds_bucket": QueueSeries(
        KUEUE, "admission_wait_bucket", _CQ, ("le", "priority_class"), ("le",), histogram=True
    ),
    "kueue_admission_wait_time_seconds_sum": QueueSeries(
        KUEUE, "admission_wait_sum", _CQ, ("priority_class",), histogram=True
    ),
    "kueue_admission_wait_time_seconds_count": QueueSeries(
        KUEUE, "admission_wait_count", _CQ, ("priority_class",), histogram=True
    ),
    "kueue_cluster_queue_resource_usage": QueueSeries(KUEUE, "resource_usage", _CQ, _RESOURCE, _RESOURCE),
    "kueue_cluster_queue_nominal_quota": QueueSeries(KUEUE, "nominal_quota", _CQ, _RESOURCE, _RESOURCE),
    "kueue_cluster_queue_borrowing_limit": QueueSeries(
        KUEUE, "borrowing_limit", _CQ, _RESOURCE, _RESOURCE, unlimited=True
    ),
    "kueue_cluster_queue_lending_limit": QueueSeries(KUEUE, "lending_limit", _CQ, _RESOURCE, _RESOURCE, unlimited=True),
    # Kueue, per LocalQueue (feature gate LocalQueueMetrics)
    "kueue_local_queue_pending_workloads": _local_queue("pending_workloads", ("status",), ("status",)),
    "kueue_local_queue_reserving_active_workloads": _local_queue("reserving_active_workloads"),
    "kueue_local_queue_admitted_active_workloads": _local_queue("admitted_active_workloads"),
    "kueue_local_queue_admitted_workloads_total": _local_queue("admitted_workloads", ("priority_class",)),
    "kueue_local_queue_resource_usage": _local_queue("resource_usage", _RESOURCE, _RESOURCE),
    # kube-state-metrics, per namespace (the node's allocatable GPUs: the cluster's own)
    "kube_pod_status_phase": QueueSeries(KUBERNETES, "pods", "namespace", ("phase",), ("phase",), summed=True),
    "kube_pod_status_unschedulable": QueueSeries(KUBERNETES, "pods_unschedulable", "namespace", summed=True),
    "kube_pod_status_scheduled": QueueSeries(
        KUBERNETES, "pods_scheduled", "namespace", ("condition",), ("condition",), summed=True
    ),
    "kube_pod_container_status_restarts_total": QueueSeries(
        KUBERNETES, "container_restarts", "namespace", ("pod", "container"), ("pod", "container")
    ),
    "kube_pod_container_resource_requests": QueueSeries(
        KUBERNETES, "gpus_requested", "namespace", ("node",), ("resource",), only=_gpu, summed=True
    ),
    "kube_node_status_allocatable": QueueSeries(
        KUBERNETES, "gpus_allocatable", None, ("node",), ("node", "resource"), only=_gpu
    ),
    # 1 while the node is cordoned (spec.unschedulable: kubectl cordon or drain), else 0; per node,
    # so the drained-capacity detector can name the nodes (fleet.scheduler.detectors)
    "kube_node_spec_unschedulable": QueueSeries(KUBERNETES, "node_unschedulable", None, ("node",), ("node",)),
    "kube_resourcequota": QueueSeries(
        KUBERNETES,
        "resource_quota",
        "namespace",
        ("resource", "resourcequota", "type"),
        ("resource", "resourcequota", "type"),
        only=_gpu_quota,
    ),
    # vpenso/prometheus-slurm-exporter, per partition and for the cluster
    "slurm_partition_jobs_pending": QueueSeries(SLURM, "jobs", "partition", fixed=(("state", "pending"),)),
    "slurm_partition_cpus_allocated": QueueSeries(SLURM, "cpus", "partition", fixed=(("state", "alloc"),)),
    "slurm_partition_cpus_idle": QueueSeries(SLURM, "cpus", "partition", fixed=(("state", "idle"),)),
    "slurm_partition_cpus_other": QueueSeries(SLURM, "cpus", "partition", fixed=(("state", "other"),)),
    "slurm_partition_cpus_total": QueueSeries(SLURM, "cpus", "partition", fixed=(("state", "total"),)),
    "slurm_account_jobs_pending": _account("jobs", "pending"),
    "slurm_account_jobs_running": _account("jobs", "running"),
    "slurm_account_jobs_suspended": _account("jobs", "suspended"),
    "slurm_account_cpus_pending": _account("cpus", "pending"),
    "slurm_account_cpus_running": _account("cpus", "running"),
    "slurm_account_gpus_pending": _account("gpus", "pending"),
    "slurm_account_gpus_running": _account("gpus", "running"),
    "slurm_queue_pending": QueueSeries(SLURM, "jobs", None, fixed=(("state", "pending"),)),
    "slurm_queue_pending_dependency": QueueSeries(SLURM, "jobs", None, fixed=(("state", "pending_dependency"),)),
    "slurm_queue_running": QueueSeries(SLURM, "jobs", None, fixed=(("state", "running"),)),
    **{
        f"slurm_nodes_{state}": QueueSeries(SLURM, "nodes", None, fixed=(("state", state),))
        for state in ("alloc", "comp", "down", "drain", "err", "fail", "idle", "maint", "mix", "resv")
    },
    **{
        f"slurm_gpus_{state}": QueueSeries(SLURM, "gpus", None, fixed=(("state", state),))
        for state in ("alloc", "idle", "other", "total")
    },
}
# Where a label becomes a column or a series key: Kubernetes names (a namespace is a DNS label of
# 63; pods, nodes, queues and quotas DNS subdomains of 253), and the rest within the series text.
SCHEDULER_LABEL_LIMITS = {
    "cluster_queue": 253,
    "preempting_cluster_queue": 253,
    "cohort": 253,
    "flavor": 253,
    "resource": 253,
    "namespace": 63,
    "pod": 253,
    "container": 63,
    "node": 253,
    "resourcequota": 253,
    "partition": 253,
    "name": 253,  # a LocalQueue's
    "account": 253,
    "reason": 128,
    "underlying_cause": 128,
    "priority_class": 253,
    "phase": 32,
    "condition": 32,
    "status": 32,
    "type": 32,
    "le": 64,
}
# Labels naming a queue or a thing in the series text: printable text only.
SCHEDULER_IDENTITY_LABELS = frozenset(
    {
        "cluster_queue",
        "preempting_cluster_queue",
        "cohort",
        "namespace",
        "partition",
        "name",
        "account",
        "pod",
        "container",
        "node",
    }
)

# The scheduler's entry in the exporter mapping table (fleet.exporters), registered from
# fleet/scheduler/plugins.py: read only by an ``auto`` push (no ?kind= names a scheduler).
MAPPINGS = (ExporterMapping("kueue, kube-state-metrics, slurm", QUEUE, store_queue_points, families=SCHEDULER_SERIES),)
