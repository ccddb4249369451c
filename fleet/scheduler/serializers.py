"""The scheduler's read-model answers, described for the API schema: the capacity plan's
``queues`` and ``quota_waits`` parts (fleet.scheduler.read) and the quota drift
(fleet.scheduler.drift). The views answer with the read models' dicts."""

from __future__ import annotations

from rest_framework import serializers


class AdmissionWaitSerializer(serializers.Serializer):
    p50 = serializers.FloatField(allow_null=True, help_text="seconds")
    p95 = serializers.FloatField(allow_null=True, help_text="seconds")
    admissions = serializers.FloatField()


class PoolQueueSerializer(serializers.Serializer):
    """A queue mapped to the pool: pending workloads now, admission waits, evictions and GPUs held."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    scheduler = serializers.CharField()
    cohort = serializers.CharField(allow_blank=True)
    team = serializers.CharField(allow_null=True)
    pending = serializers.FloatField(allow_null=True)
    inadmissible = serializers.FloatField(allow_null=True)
    wait_1h = AdmissionWaitSerializer(allow_null=True, help_text="null without admissions")
    wait_24h = AdmissionWaitSerializer(allow_null=True)
    evicted = serializers.FloatField()
    preempted = serializers.FloatField(help_text="preemptions it caused")
    gpus_allocated = serializers.FloatField(allow_null=True)


class TeamEventsSerializer(serializers.Serializer):
    team = serializers.CharField()
    evicted = serializers.FloatField()
    preempted = serializers.FloatField()
    evicted_reasons = serializers.DictField(child=serializers.FloatField())
    preempted_reasons = serializers.DictField(child=serializers.FloatField())


class PoolQueuesSerializer(serializers.Serializer):
    """The scheduler's side of a capacity pool (fleet.scheduler.read.pool_queues)."""

    pool = serializers.IntegerField()
    queues = PoolQueueSerializer(many=True)
    teams = TeamEventsSerializer(many=True)
    pending = serializers.FloatField()
    inadmissible = serializers.FloatField()
    gpus_allocated = serializers.FloatField(allow_null=True, help_text="the scheduler's, over the pool's queues")
    gpus_reserved = serializers.IntegerField(help_text="the console's reservations holding the pool now")
    nodes_drained = serializers.FloatField(allow_null=True, help_text="Slurm's")
    nodes_down = serializers.FloatField(allow_null=True)
    window_hours = serializers.IntegerField()


class QuotaWaitSerializer(serializers.Serializer):
    """A team's queue wait, to set beside its quota on a pool."""

    pool = serializers.IntegerField()
    team = serializers.CharField()
    text = serializers.CharField()
    title = serializers.CharField()


class SchedulerQuotaSerializer(serializers.Serializer):
    """GPU quota as the scheduler reports it; a null limit is unset (+Inf)."""

    nominal_gpus = serializers.FloatField()
    borrowing_limit_gpus = serializers.FloatField(allow_null=True)
    lending_limit_gpus = serializers.FloatField(allow_null=True)
    reported_at = serializers.DateTimeField()


class ConsoleQuotaSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    nominal_gpus = serializers.IntegerField()
    borrowing_limit_gpus = serializers.IntegerField(allow_null=True)
    lending_limit_gpus = serializers.IntegerField(allow_null=True)


class QuotaDifferenceSerializer(serializers.Serializer):
    scheduler = serializers.FloatField(allow_null=True)
    console = serializers.FloatField(allow_null=True)


class QuotaDriftRowSerializer(serializers.Serializer):
    """A mapped queue set beside its team's TeamQuota on its pool."""

    queue = serializers.IntegerField()
    queue_name = serializers.CharField()
    site = serializers.CharField()
    scheduler = serializers.CharField()
    pool = serializers.IntegerField(allow_null=True)
    pool_name = serializers.CharField(allow_null=True)
    team = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(
        choices=["match", "drift", "missing-in-console", "missing-in-scheduler", "missing-both"]
    )
    scheduler_quota = SchedulerQuotaSerializer(allow_null=True)
    console_quota = ConsoleQuotaSerializer(allow_null=True)
    differences = serializers.DictField(child=QuotaDifferenceSerializer(), help_text="by TeamQuota field")


class QuotaDriftAnswerSerializer(serializers.Serializer):
    """GET /api/v1/scheduler/quota-drift/."""

    resource = serializers.CharField()
    mapped_queues = serializers.IntegerField()
    drifted = serializers.IntegerField()
    results = QuotaDriftRowSerializer(many=True)


class QuotaImportedSerializer(serializers.Serializer):
    """POST /api/v1/scheduler/quota-drift/import/: the TeamQuota as imported."""

    id = serializers.IntegerField()
    team = serializers.IntegerField()
    pool = serializers.IntegerField()
    nominal_gpus = serializers.IntegerField()
    borrowing_limit_gpus = serializers.IntegerField(allow_null=True)
    lending_limit_gpus = serializers.IntegerField(allow_null=True)
