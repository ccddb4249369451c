"""The ``episodes`` a job's snapshot carries (fleet.correlation.episodes.job_episodes), described
for the API schema; the snapshot's view answers with the read model's dicts."""

from __future__ import annotations

from rest_framework import serializers


class EpisodeWindowSerializer(serializers.Serializer):
    """[from, to): ``from`` and ``to`` are Python keywords, hence declared in get_fields."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            "from": serializers.DateTimeField(help_text="the finding's start less the fabric detector's window"),
            "to": serializers.DateTimeField(help_text="its clear, or now while it fires"),
        }


class IncidentLinkSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    title = serializers.CharField(allow_blank=True)
    url = serializers.CharField()


class EpisodeCauseSerializer(serializers.Serializer):
    fingerprint = serializers.CharField()
    headline = serializers.CharField(allow_blank=True)
    detail = serializers.CharField(allow_blank=True)
    summary = serializers.CharField(allow_blank=True)
    incident = IncidentLinkSerializer(allow_null=True)


class EpisodePortSerializer(serializers.Serializer):
    """A compute port of the node that flapped, degraded or is down over the window."""

    name = serializers.CharField()
    kind = serializers.CharField()
    flaps = serializers.FloatField()
    symbol_errors = serializers.FloatField()
    below_rate = serializers.BooleanField()
    degraded = serializers.BooleanField()
    state = serializers.FloatField(allow_null=True, help_text="InfiniBand port state id (4: Active)")
    flapped = serializers.BooleanField()
    flapped_at = serializers.DateTimeField(allow_null=True)
    down = serializers.BooleanField()
    rate_bytes_per_second = serializers.FloatField(allow_null=True)
    rated_bytes_per_second = serializers.FloatField(allow_null=True)


class EpisodeMountSerializer(serializers.Serializer):
    """A datasets or checkpoints mount of the node over the window."""

    mountpoint = serializers.CharField()
    fstype = serializers.CharField()
    purpose = serializers.CharField()
    read_bytes_per_second = serializers.FloatField(allow_null=True)
    io_busy_pct = serializers.FloatField(allow_null=True)
    free_pct = serializers.FloatField(allow_null=True)
    saturated = serializers.BooleanField()
    low_free = serializers.BooleanField()
    starving = serializers.CharField(allow_blank=True, help_text="why its file system starves readers; '' when not")


class EpisodeNodeSerializer(serializers.Serializer):
    hostname = serializers.CharField()
    ports = EpisodePortSerializer(many=True)
    mounts = EpisodeMountSerializer(many=True)


class JobEpisodeSerializer(serializers.Serializer):
    """A hang, data stall or NCCL failure of the job with what its nodes' fabric and storage did."""

    finding_id = serializers.IntegerField()
    kind = serializers.CharField(help_text="Hang, Data stall or Failure")
    failure_class = serializers.CharField(allow_null=True)
    summary = serializers.CharField()
    status = serializers.CharField()
    ongoing = serializers.BooleanField()
    started_at = serializers.DateTimeField()
    cleared_at = serializers.DateTimeField(allow_null=True)
    window = EpisodeWindowSerializer()
    gpu_hours = serializers.FloatField(allow_null=True)
    incident = IncidentLinkSerializer(allow_null=True)
    cause = EpisodeCauseSerializer(allow_null=True)
    nodes = EpisodeNodeSerializer(many=True)
    troubled_ports = serializers.IntegerField()
    flapped_ports = serializers.IntegerField()
    has_mounts = serializers.BooleanField()
    starving_mounts = serializers.IntegerField()
