"""Kueue, kube-state-metrics and Slurm exporter series through the Prometheus door: each fixture
mapped against an independent reading of its lines, queues registered once, unknown series
counted, bad lines refused naming the line, redeliveries stored once."""

from __future__ import annotations

import math

import pytest

from fleet.models import IngestBatch, SchedulerQueue, SchedulerSample
from fleet.scheduler.mappings import SCHEDULER_SERIES
from tests.fleet.scheduler.support import KSM, KUEUE, SLURM, label_text, push, samples, stored

# Kueue's names, read independently of the door's table: quantity, the label naming the queue, and
# the labels that tell a queue's series apart.
KUEUE_READING = {
    "kueue_pending_workloads": ("pending_workloads", "cluster_queue", ("status",)),
    "kueue_reserving_active_workloads": ("reserving_active_workloads", "cluster_queue", ()),
    "kueue_admitted_active_workloads": ("admitted_active_workloads", "cluster_queue", ()),
    "kueue_admitted_workloads_total": ("admitted_workloads", "cluster_queue", ("priority_class",)),
    "kueue_evicted_workloads_total": (
        "evicted_workloads",
        "cluster_queue",
        ("reason", "underlying_cause", "priority_class"),
    ),
    "kueue_preempted_workloads_total": ("preempted_workloads", "preempting_cluster_queue", ("reason",)),
    "kueue_admission_wait_time_seconds_bucket": ("admission_wait_bucket", "cluster_queue", ("le", "priority_class")),
    "kueue_admission_wait_time_seconds_sum": ("admission_wait_sum", "cluster_queue", ("priority_class",)),
    "kueue_admission_wait_time_seconds_count": ("admission_wait_count", "cluster_queue", ("priority_class",)),
    "kueue_cluster_queue_resource_usage": ("resource_usage", "cluster_queue", ("flavor", "resource")),
    "kueue_cluster_queue_nominal_quota": ("nominal_quota", "cluster_queue", ("flavor", "resource")),
    "kueue_cluster_queue_borrowing_limit": ("borrowing_limit", "cluster_queue", ("flavor", "resource")),
    "kueue_cluster_queue_lending_limit": ("lending_limit", "cluster_queue", ("flavor", "resource")),
}
# Kueue's LocalQueue names (feature gate LocalQueueMetrics): quantity and the labels kept; the
# queue is registered as namespace/name.
LOCAL_QUEUE_READING = {
    "kueue_local_queue_pending_workloads": ("pending_workloads", ("status",)),
    "kueue_local_queue_reserving_active_workloads": ("reserving_active_workloads", ()),
    "kueue_local_queue_admitted_active_workloads": ("admitted_active_workloads", ()),
    "kueue_local_queue_admitted_workloads_total": ("admitted_workloads", ("priority_class",)),
    "kueue_local_queue_resource_usage": ("resource_usage", ("flavor", "resource")),
}


def test_every_kueue_line_is_stored_under_its_cluster_queue_or_local_queue_and_quantity(client, token_a) -> None:
    response = push(client, token_a, KUEUE)
    assert response.status_code == 202, response.content
    expected = {}
    for name, labels, value in samples(KUEUE):
        if name in KUEUE_READING:
            quantity, queue_label, keep = KUEUE_READING[name]
            series = label_text({k: labels[k] for k in keep if k in labels})
            expected[("kueue", labels[queue_label], quantity, series)] = value
        elif name in LOCAL_QUEUE_READING:
            quantity, keep = LOCAL_QUEUE_READING[name]
            series = label_text({k: labels[k] for k in keep if k in labels})
            expected[("kueue", f"{labels['namespace']}/{labels['name']}", quantity, series)] = value
    assert stored() == expected
    assert response.json()["scheduler_samples"] == len(expected) == 63 + 14
    assert expected[("kueue", "team-b-h100", "pending_workloads", 'status="inadmissible"')] == 4
    assert expected[("kueue", "team-a-h100", "preempted_workloads", 'reason="InCohortReclamation"')] == 5
    assert expected[("kueue", "team-b/batch", "pending_workloads", 'status="inadmissible"')] == 4
    assert expected[("kueue", "team-a/training", "admitted_workloads", 'priority_class="team-a-standard"')] == 187
    kinds = dict(SchedulerQueue.objects.values_list("name", "kind"))
    assert kinds == {
        "team-a-h100": "clusterqueue",
        "team-b-h100": "clusterqueue",
        "team-a/training": "localqueue",
        "team-b/batch": "localqueue",
    }


def test_an_unset_limit_is_kept_as_infinity(client, token_a) -> None:
    assert push(client, token_a, KUEUE).status_code == 202
    limits = {
        (s.queue.name, s.quantity): s.value
        for s in SchedulerSample.objects.select_related("queue").filter(quantity__endswith="_limit")
    }
    assert limits[("team-b-h100", "borrowing_limit")] == math.inf and limits[("team-a-h100", "borrowing_limit")] == 16
    assert limits[("team-b-h100", "lending_limit")] == math.inf and limits[("team-a-h100", "lending_limit")] == 8


def test_cluster_queues_are_registered_once_with_their_cohort(client, site_a, site_b, token_a, token_b) -> None:
    for _ in range(2):  # untimestamped: two observations, one registration
        assert push(client, token_a, KUEUE).status_code == 202
    assert push(client, token_b, KUEUE).status_code == 202
    queues = sorted(
        SchedulerQueue.objects.filter(kind="clusterqueue").values_list("site__name", "scheduler", "name", "cohort")
    )
    assert queues == [
        (site_a.name, "kueue", "team-a-h100", "h100-pool"),
        (site_a.name, "kueue", "team-b-h100", "h100-pool"),
        (site_b.name, "kueue", "team-a-h100", "h100-pool"),
        (site_b.name, "kueue", "team-b-h100", "h100-pool"),
    ]
    assert SchedulerQueue.objects.filter(pool__isnull=False).count() == 0  # mapped to a pool later


def test_a_queue_moved_to_another_cohort_follows_it(client, token_a) -> None:
    assert push(client, token_a, KUEUE).status_code == 202
    moved = (
        "# TYPE kueue_cluster_queue_nominal_quota gauge\n"
        'kueue_cluster_queue_nominal_quota{cluster_queue="team-a-h100",cohort="a100-pool",flavor="a100",'
        'resource="nvidia.com/gpu"} 8\n'
        'kueue_pending_workloads{cluster_queue="team-b-h100",status="active"} 1\n'
    )
    assert push(client, token_a, moved).status_code == 202
    cohorts = dict(SchedulerQueue.objects.filter(kind="clusterqueue").values_list("name", "cohort"))
    assert cohorts == {"team-a-h100": "a100-pool", "team-b-h100": "h100-pool"}  # no cohort label: unchanged


def test_kueue_series_this_console_does_not_use_are_counted_as_ignored(client, token_a) -> None:
    body = push(client, token_a, KUEUE).json()
    unused = [name for name, _, _ in samples(KUEUE) if name not in KUEUE_READING | LOCAL_QUEUE_READING]
    assert body["ignored"] == len(unused) == 16
    assert body["ignored_metrics"] == {
        "kueue_admission_attempts_total": 2,
        "kueue_build_info": 1,
        "kueue_cluster_queue_status": 6,
        "kueue_local_queue_status": 6,
        "go_goroutines": 1,
    }


def test_a_follower_replicas_copy_is_ignored(client, token_a) -> None:
    body = (
        'kueue_pending_workloads{cluster_queue="team-a-h100",replica_role="follower",status="active"} 9\n'
        'kueue_pending_workloads{cluster_queue="team-a-h100",replica_role="leader",status="inadmissible"} 2\n'
    )
    response = push(client, token_a, body)
    assert response.status_code == 202 and response.json()["ignored"] == 1
    assert stored() == {("kueue", "team-a-h100", "pending_workloads", 'status="inadmissible"'): 2}


def test_kube_state_metrics_pods_are_summed_per_namespace_and_gpus_kept(client, token_a) -> None:
    response = push(client, token_a, KSM)
    assert response.status_code == 202, response.content
    expected: dict[tuple[str, str, str, str], float] = {}

    def add(queue: str, quantity: str, series: str, value: float) -> None:
        key = ("kubernetes", queue, quantity, series)
        expected[key] = expected.get(key, 0.0) + value

    for name, labels, value in samples(KSM):
        ns = labels.get("namespace", "")
        if name == "kube_pod_status_phase":
            add(ns, "pods", f'phase="{labels["phase"]}"', value)
        elif name == "kube_pod_status_scheduled":
            add(ns, "pods_scheduled", f'condition="{labels["condition"]}"', value)
        elif name == "kube_pod_status_unschedulable":
            add(ns, "pods_unschedulable", "", value)
        elif name == "kube_pod_container_status_restarts_total":
            add(ns, "container_restarts", f'container="{labels["container"]}",pod="{labels["pod"]}"', value)
        elif name == "kube_pod_container_resource_requests" and labels["resource"] == "nvidia_com_gpu":
            add(ns, "gpus_requested", f'node="{labels["node"]}"', value)
        elif name == "kube_node_status_allocatable" and labels["resource"] == "nvidia_com_gpu":
            add("", "gpus_allocatable", f'node="{labels["node"]}"', value)
        elif name == "kube_node_spec_unschedulable":
            add("", "node_unschedulable", f'node="{labels["node"]}"', value)
        elif name == "kube_resourcequota" and labels["resource"] == "requests.nvidia.com/gpu":
            add(ns, "resource_quota", label_text({k: labels[k] for k in ("resource", "resourcequota", "type")}), value)
    assert stored() == expected
    assert expected[("kubernetes", "team-a", "pods", 'phase="Running"')] == 2
    assert expected[("kubernetes", "team-a", "gpus_requested", 'node=""')] == 8  # the pending worker's
    assert expected[("kubernetes", "team-b", "gpus_requested", 'node="gpu-a-019"')] == 4
    assert expected[("kubernetes", "", "node_unschedulable", 'node="gpu-a-018"')] == 1  # cordoned
    assert set(SchedulerQueue.objects.values_list("scheduler", "name")) == {
        ("kubernetes", ""),
        ("kubernetes", "team-a"),
        ("kubernetes", "team-b"),
    }
    # Each node's cpu, ephemeral_storage, memory and pods (12), the CPU requests (3), the pods quota
    # (hard and used) and kube_pod_info (5).
    assert response.json()["ignored"] == 22


def test_the_slurm_exporters_series_map_to_partitions_accounts_and_the_cluster(client, token_a) -> None:
    response = push(client, token_a, SLURM)
    assert response.status_code == 202, response.content
    expected = {}
    ignored = 0
    for name, labels, value in samples(SLURM):
        state = name.rsplit("_", 1)[-1]
        if name.startswith(("slurm_nodes_", "slurm_gpus_")) and name != "slurm_gpus_utilization":
            expected[("slurm", "", name.split("_")[1], f'state="{state}"')] = value
        elif name.startswith("slurm_partition_cpus_"):
            state = {"allocated": "alloc"}.get(state, state)
            expected[("slurm", labels["partition"], "cpus", f'state="{state}"')] = value
        elif name == "slurm_partition_jobs_pending":
            expected[("slurm", labels["partition"], "jobs", 'state="pending"')] = value
        elif name.startswith("slurm_account_"):  # slurm_account_<jobs|cpus|gpus>_<state>
            quantity = name.split("_")[2]
            expected[("slurm", labels["account"], quantity, f'state="{state}"')] = value
        elif name in ("slurm_queue_pending", "slurm_queue_running"):
            expected[("slurm", "", "jobs", f'state="{state}"')] = value
        elif name == "slurm_queue_pending_dependency":
            expected[("slurm", "", "jobs", 'state="pending_dependency"')] = value
        else:
            ignored += 1
    assert stored() == expected
    assert expected[("slurm", "", "nodes", 'state="drain"')] == 3
    assert expected[("slurm", "h100", "jobs", 'state="pending"')] == 17
    assert expected[("slurm", "team-b", "gpus", 'state="pending"')] == 48
    assert expected[("slurm", "team-a", "jobs", 'state="running"')] == 29
    assert response.json()["ignored"] == ignored == 7
    kinds = {name: kind for name, kind in SchedulerQueue.objects.values_list("name", "kind")}
    assert kinds == {"": "cluster", "debug": "partition", "h100": "partition", "team-a": "account", "team-b": "account"}


def test_an_account_named_like_a_partition_is_a_queue_of_its_own(client, token_a) -> None:
    body = (
        'slurm_partition_jobs_pending{partition="h100"} 17\n'
        'slurm_account_jobs_pending{account="h100"} 5\n'
        'slurm_account_jobs_running{account="h100"} 2\n'
    )
    response = push(client, token_a, body)
    assert response.status_code == 202 and response.json()["scheduler_samples"] == 3
    values = {
        (s.queue.kind, s.series): s.value
        for s in SchedulerSample.objects.select_related("queue").filter(quantity="jobs")
    }
    assert values == {
        ("partition", 'state="pending"'): 17,
        ("account", 'state="pending"'): 5,
        ("account", 'state="running"'): 2,
    }


def test_a_local_queue_series_without_its_namespace_is_refused_naming_it(client, token_a) -> None:
    body = 'kueue_local_queue_admitted_active_workloads{name="training",replica_role="leader"} 6\n'
    response = push(client, token_a, body)
    assert response.status_code == 400 and response.json()["field"] == "namespace"
    assert not SchedulerQueue.objects.exists()


def test_a_bad_line_is_refused_naming_it_and_nothing_is_written(client, token_a) -> None:
    lines = KUEUE.splitlines()
    target = next(i for i, line in enumerate(lines) if line.startswith("kueue_pending_workloads{"))
    lines[target] = 'kueue_pending_workloads{cluster_queue="team-a-h100",status="active" 3'
    response = push(client, token_a, "\n".join(lines) + "\n")
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"line {target + 1}:")
    assert not SchedulerSample.objects.exists() and not SchedulerQueue.objects.exists()
    assert not IngestBatch.objects.exists()


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('kueue_pending_workloads{status="active"} 3', "cluster_queue"),
        ('kueue_pending_workloads{cluster_queue="team-a-h100"} 3', "status"),
        ('kueue_preempted_workloads_total{reason="InClusterQueue"} 1', "preempting_cluster_queue"),
        ('kueue_admission_wait_time_seconds_bucket{cluster_queue="q",le="soon"} 1', "le"),
        ('kueue_cluster_queue_nominal_quota{cluster_queue="q",resource="nvidia.com/gpu"} 8', "flavor"),
        ('kube_pod_status_phase{pod="p",phase="Running"} 1', "namespace"),
        ('slurm_partition_jobs_pending{partition=""} 4', "partition"),
        (f'kueue_admitted_active_workloads{{cluster_queue="{"q" * 254}"}} 1', "cluster_queue"),
        ('kueue_admitted_active_workloads{cluster_queue="team\\na"} 1', "cluster_queue"),
    ],
)
def test_a_series_missing_or_overlong_label_is_refused_naming_line_and_field(client, token_a, line, field) -> None:
    body = f'kueue_admitted_active_workloads{{cluster_queue="ok"}} 1\n{line}\n'
    response = push(client, token_a, body)
    assert response.status_code == 400, response.content
    assert response.json()["error"].startswith("line 2:") and response.json()["field"] == field
    assert not SchedulerSample.objects.exists()


def test_values_no_read_can_use_are_ignored_and_counted(client, token_a) -> None:
    body = (
        "# TYPE kueue_admitted_workloads_total counter\n"
        'kueue_admitted_workloads_total{cluster_queue="a"} NaN\n'
        'kueue_admitted_workloads_total{cluster_queue="b"} -2\n'
        'kueue_admitted_workloads_total{cluster_queue="c"} +Inf\n'
        'kueue_admitted_workloads_total{cluster_queue="d"} 7\n'
    )
    response = push(client, token_a, body)
    assert response.status_code == 202
    assert (response.json()["scheduler_samples"], response.json()["ignored"]) == (1, 3)
    assert stored() == {("kueue", "d", "admitted_workloads", ""): 7}


def test_a_redelivery_writes_nothing(client, token_a) -> None:
    for _ in range(2):
        assert push(client, token_a, KUEUE, **{"Idempotency-Key": "kueue-0001"}).status_code == 202
    assert SchedulerSample.objects.count() == 63 + 14
    assert IngestBatch.objects.filter(key__endswith=":scheduler").count() == 1


def test_kind_node_keeps_out_the_scheduler_series(client, token_a) -> None:
    node = 'node_network_carrier_changes_total{device="eth0"} 3\n'
    response = push(client, token_a, node + SLURM, query="?hostname=gpu-a-017&kind=node")
    assert response.status_code == 202 and response.json()["scheduler_samples"] == 0
    assert response.json()["ignored"] == len(samples(SLURM))  # every Slurm line, accounts' too
    assert response.json()["ignored_metrics"]["slurm_account_jobs_pending"] == 2
    assert not SchedulerSample.objects.exists()


def test_every_mapped_name_is_one_its_exporter_prints() -> None:
    fixtures = KUEUE + KSM + SLURM
    for name in SCHEDULER_SERIES:
        family = "kueue_admission_wait_time_seconds" if name.startswith("kueue_admission_wait_time_seconds") else name
        assert f"# TYPE {family} " in fixtures and f"# HELP {family} " in fixtures, name
        assert f"\n{name}" in fixtures, name


def test_remote_write_carries_the_same_series_as_the_text_door(client, token_a) -> None:
    from tests.fleet.telemetry.test_prometheus_remote_write import now_ms, send, write_request

    response = send(client, token_a, write_request(KUEUE, now_ms()))
    assert response.status_code == 204, response.content
    through_remote_write = stored()
    SchedulerSample.objects.all().delete()
    assert push(client, token_a, KUEUE).status_code == 202
    assert through_remote_write == stored() and len(through_remote_write) == 63 + 14


def test_a_histogram_with_a_part_no_read_can_use_is_ignored_whole(client, token_a) -> None:
    body = (
        "# TYPE kueue_admission_wait_time_seconds histogram\n"
        'kueue_admission_wait_time_seconds_bucket{cluster_queue="a",le="1"} 2\n'
        'kueue_admission_wait_time_seconds_bucket{cluster_queue="a",le="+Inf"} NaN\n'
        'kueue_admission_wait_time_seconds_sum{cluster_queue="a"} 3.5\n'
        'kueue_admission_wait_time_seconds_count{cluster_queue="a"} 4\n'
        'kueue_admission_wait_time_seconds_bucket{cluster_queue="b",le="1"} 1\n'
        'kueue_admission_wait_time_seconds_bucket{cluster_queue="b",le="+Inf"} 1\n'
        'kueue_admission_wait_time_seconds_sum{cluster_queue="b"} 0.5\n'
        'kueue_admission_wait_time_seconds_count{cluster_queue="b"} 1\n'
    )
    response = push(client, token_a, body)
    assert response.status_code == 202
    assert (response.json()["scheduler_samples"], response.json()["ignored"]) == (4, 4)
    assert {queue for _, queue, _, _ in stored()} == {"b"}
