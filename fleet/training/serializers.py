"""The training pages' read-model answers (fleet.training.read), described for the API schema.
The views answer with the read model's dicts; these classes only describe them. GPU-hours are
rounded to 0.01, shares to 0.0001; a share of nothing allocated is null, not 0."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import serializers

from console.schema import CustomWindowAnswerSerializer, CustomWindowSerializer

CATEGORIES_HELP = (
    "by category: productive, at_risk, startup, data_stall, checkpoint_save, checkpoint_restore, disruption, hang, idle"
)


def _share() -> serializers.FloatField:
    return serializers.FloatField(allow_null=True, help_text="0-1; null when nothing was allocated")


def _column(child: serializers.Field | None = None) -> serializers.ListField:
    return serializers.ListField(child=child or serializers.FloatField(allow_null=True))


class GoodputBlockSerializer(serializers.Serializer):
    """Retained goodput beside the shares at risk and lost, and their GPU-hours."""

    goodput = _share()
    at_risk_share = _share()
    lost_share = _share()
    allocated_gpu_h = serializers.FloatField()
    productive_gpu_h = serializers.FloatField()
    at_risk_gpu_h = serializers.FloatField()
    lost_gpu_h = serializers.FloatField()


class GoodputWindowSerializer(GoodputBlockSerializer):
    since = serializers.DateTimeField(help_text="the window's first hour")


class RangeAccountSerializer(GoodputBlockSerializer):
    steps = serializers.IntegerField()
    tokens = serializers.IntegerField()


class BreakdownRowSerializer(serializers.Serializer):
    category = serializers.CharField()
    label = serializers.CharField()
    gpu_h = serializers.FloatField()
    share = _share()
    badput = serializers.BooleanField()


class CategorySerializer(serializers.Serializer):
    category = serializers.CharField()
    label = serializers.CharField()


class OverviewSeriesSerializer(serializers.Serializer):
    hours = serializers.ListField(child=serializers.DateTimeField())
    gpu_h = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField()), help_text=CATEGORIES_HELP
    )
    goodput = _column()


class TopJobSerializer(serializers.Serializer):
    """A job among those that lost the most GPU-hours over the range."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()
    state = serializers.CharField()
    gang_size = serializers.IntegerField()
    cluster = serializers.CharField(allow_blank=True)
    lost_gpu_h = serializers.FloatField()
    allocated_gpu_h = serializers.FloatField()
    goodput = _share()
    at_risk_share = _share()
    top_cause = serializers.CharField()
    top_cause_label = serializers.CharField()
    url = serializers.CharField()


class RunningJobSerializer(serializers.Serializer):
    """A job holding GPUs now, with its step rate over the last five minutes."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()
    cluster = serializers.CharField(allow_blank=True)
    site = serializers.CharField()
    state = serializers.CharField()
    gang_size = serializers.IntegerField()
    last_step = serializers.IntegerField(allow_null=True)
    last_step_at = serializers.DateTimeField(allow_null=True)
    last_step_age_s = serializers.FloatField(allow_null=True)
    step_time_s = serializers.FloatField(allow_null=True)
    last_checkpoint_at = serializers.DateTimeField(allow_null=True)
    allocated_since = serializers.DateTimeField(allow_null=True)
    failures = serializers.IntegerField()
    steps_window = serializers.IntegerField(help_text="step events in the last five minutes")
    step_rate = serializers.FloatField(allow_null=True, help_text="steps/s; null under two steps")
    tokens_per_s = serializers.FloatField(allow_null=True)
    url = serializers.CharField()


class TrainingOverviewAnswerSerializer(CustomWindowAnswerSerializer):
    """GET /api/v1/training/overview: cluster goodput, the range's account, breakdown and hourly
    series, the top jobs by GPU-hours lost and the jobs holding GPUs."""

    ts = serializers.DateTimeField()
    range_end = serializers.DateTimeField(required=False, help_text="a custom window's end, on the hour")
    range_start = serializers.DateTimeField()
    goodput = serializers.DictField(child=GoodputWindowSerializer(), help_text="by window: 1h, 24h, 7d")
    account = RangeAccountSerializer()
    breakdown = BreakdownRowSerializer(many=True)
    categories = CategorySerializer(many=True)
    series = OverviewSeriesSerializer()
    top_jobs = TopJobSerializer(many=True)
    running = RunningJobSerializer(many=True)


class JobStateSerializer(serializers.Serializer):
    """The job's row as its page shows it."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()
    cluster = serializers.CharField(allow_blank=True)
    site = serializers.CharField()
    framework = serializers.CharField()
    scheduler = serializers.CharField()
    scheduler_id = serializers.CharField(allow_blank=True)
    priority_tier = serializers.CharField()
    gang_size = serializers.IntegerField()
    checkpoint_interval_s = serializers.IntegerField(allow_null=True)
    state = serializers.CharField()
    state_label = serializers.CharField()
    holds_gpus = serializers.BooleanField()
    first_allocated_at = serializers.DateTimeField(allow_null=True)
    allocated_since = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    last_event_at = serializers.DateTimeField(allow_null=True)
    last_step = serializers.IntegerField(allow_null=True)
    last_step_at = serializers.DateTimeField(allow_null=True)
    last_step_age_s = serializers.FloatField(allow_null=True)
    last_step_time_s = serializers.FloatField(allow_null=True)
    last_checkpoint_at = serializers.DateTimeField(allow_null=True)
    last_checkpoint_step = serializers.IntegerField(allow_null=True)
    failures = serializers.IntegerField()
    events_seen = serializers.IntegerField()


class JobAccountSerializer(GoodputBlockSerializer):
    """The job's account: exact from every event, or from its hourly rows for a long job."""

    gpu_s = serializers.DictField(child=serializers.FloatField(), help_text=CATEGORIES_HELP)
    allocated_gpu_s = serializers.FloatField()
    breakdown = BreakdownRowSerializer(many=True)
    steps = serializers.IntegerField()
    exact = serializers.BooleanField(help_text="false: read from the hourly accounts")
    as_of = serializers.DateTimeField(allow_null=True, help_text="the oldest event not yet counted (hourly rows)")


class JobEventRowSerializer(serializers.Serializer):
    """A non-step event (timeline, chart marker)."""

    id = serializers.CharField(help_text="the sender's event id")
    seq = serializers.IntegerField()
    ts = serializers.DateTimeField()
    kind = serializers.CharField()
    label = serializers.CharField()
    step = serializers.IntegerField(allow_null=True)
    duration_s = serializers.FloatField(allow_null=True)
    bytes = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField(allow_blank=True)
    failure_class = serializers.CharField(allow_null=True, help_text="failed and preempted events only")
    failure_class_label = serializers.CharField(allow_null=True)
    node = serializers.CharField(allow_blank=True)


class StepSeriesSerializer(serializers.Serializer):
    """Per minute (per hour for a custom window of days); a null point is a gap without steps."""

    ts = serializers.ListField(child=serializers.DateTimeField())
    steps = _column(serializers.IntegerField(allow_null=True))
    step_rate = _column()
    tokens_per_s = _column()
    step_time_s = _column()
    data_wait_share = _column()
    step = _column(serializers.IntegerField(allow_null=True))


class JobGpuSeriesSerializer(serializers.Serializer):
    ts = serializers.ListField(child=serializers.DateTimeField())
    util_mean = _column()
    util_min = _column()
    power_kw = _column()
    gpus = serializers.ListField(child=serializers.IntegerField(), help_text="GPUs reporting in the bucket")


class JobSeriesSerializer(CustomWindowSerializer):
    """The charts' window and series; ``range``, ``from``, ``to`` and ``bucket_seconds`` only for a
    custom window."""

    window_always_said = False
    range = serializers.CharField(required=False)
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    bucket_seconds = serializers.IntegerField(required=False)
    steps = StepSeriesSerializer()
    gpus = JobGpuSeriesSerializer()


class JobMarkersSerializer(serializers.Serializer):
    checkpoints = JobEventRowSerializer(many=True)
    failures = JobEventRowSerializer(many=True)
    restores = JobEventRowSerializer(many=True)


class LossesTotalSerializer(serializers.Serializer):
    cost_gpu_h = serializers.FloatField()
    lost_gpu_h = serializers.FloatField()
    waiting_gpu_h = serializers.FloatField()
    reinit_gpu_h = serializers.FloatField()
    restore_gpu_h = serializers.FloatField()


class LossRowSerializer(LossesTotalSerializer):
    """One disruption: what it cost (the sum of its parts) and the checkpoint it fell back to."""

    ts = serializers.DateTimeField()
    kind = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)
    failure_class = serializers.CharField(allow_null=True)
    failure_class_label = serializers.CharField(allow_null=True)
    lost_gpu_s = serializers.FloatField()
    cost_gpu_s = serializers.FloatField()
    recovered = serializers.BooleanField()
    growing = serializers.CharField(allow_null=True, help_text="waiting or reinit while the cost still grows")
    checkpoint_step = serializers.IntegerField(allow_null=True)
    checkpoint_ts = serializers.DateTimeField(allow_null=True)


class CheckpointAdviceSerializer(serializers.Serializer):
    """The checkpoint advisor (fleet.training.advisor.Advice): intervals and costs in seconds,
    waste as fractions of allocated time, the saving in GPU-hours a week."""

    gang_size = serializers.IntegerField()
    checkpoint_cost_s = serializers.FloatField()
    checkpoint_cost_source = serializers.CharField(help_text="job or cluster")
    saves_observed = serializers.IntegerField()
    failures_observed = serializers.IntegerField()
    cluster_gpu_hours = serializers.FloatField()
    gpu_mtbf_h = serializers.FloatField()
    mtbf_assumed = serializers.BooleanField()
    job_mtbf_s = serializers.FloatField()
    current_interval_s = serializers.FloatField(allow_null=True)
    current_interval_source = serializers.CharField(allow_null=True, help_text="planned or observed")
    young_interval_s = serializers.FloatField()
    daly_interval_s = serializers.FloatField()
    recommended_interval_s = serializers.FloatField()
    waste_current = serializers.FloatField(allow_null=True)
    waste_recommended = serializers.FloatField()
    gpu_hours_saved_per_week = serializers.FloatField(allow_null=True)
    assumptions = serializers.ListField(child=serializers.CharField())
    gpu_mtbf_source = serializers.CharField(help_text="observed, assumed or blended")
    observed_gpu_mtbf_h = serializers.FloatField(allow_null=True)
    assumed_gpu_mtbf_h = serializers.FloatField()
    observed_weight = serializers.FloatField()
    mtbf_explained = serializers.CharField(allow_blank=True)
    waste_young = serializers.FloatField()
    saving_interval_s = serializers.FloatField()
    saving_explained = serializers.CharField(allow_blank=True)
    job_id = serializers.IntegerField(allow_null=True)
    gang_class = serializers.CharField(allow_null=True)
    jobs = serializers.IntegerField()
    window_days = serializers.IntegerField()


# Parts the rooms above training add to a job's snapshot: key -> the serializer describing it
# (fleet.training.api.register_job_snapshot_part).
snapshot_part_serializers: dict[str, serializers.Field] = {}


class JobSnapshotAnswerSerializer(serializers.Serializer):
    """GET /api/v1/training/jobs/<id>/snapshot: everything a job's page draws."""

    ts = serializers.DateTimeField()
    job = JobStateSerializer()
    account = JobAccountSerializer()
    timeline = JobEventRowSerializer(many=True, help_text="non-step events, newest first")
    series = JobSeriesSerializer()
    markers = JobMarkersSerializer()
    losses = LossRowSerializer(many=True)
    losses_total = LossesTotalSerializer()
    advice = CheckpointAdviceSerializer(allow_null=True, help_text="null until a checkpoint cost is measured")
    watermark = serializers.IntegerField(help_text="the live pushes continue from this seq")

    def get_fields(self) -> dict[str, Any]:
        # The parts registered from above (at start-up, before any schema is generated).
        return {**super().get_fields(), **copy.deepcopy(snapshot_part_serializers)}
