"""The storage page's read-model answer (fleet.storage.read.snapshot), described for the API
schema; the view answers with the read model's dict."""

from __future__ import annotations

from rest_framework import serializers

from console.schema import CustomWindowSerializer


class PlacedJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()


class MountSerializer(serializers.Serializer):
    """A mount: free space, throughput and I/O time over the window, the running jobs on its node."""

    id = serializers.IntegerField()
    hostname = serializers.CharField()
    site = serializers.CharField()
    mountpoint = serializers.CharField()
    fstype = serializers.CharField()
    device = serializers.CharField()
    purpose = serializers.CharField()
    disk = serializers.CharField(allow_null=True, help_text="the local disk under it, if any")
    size_bytes = serializers.FloatField(allow_null=True)
    avail_bytes = serializers.FloatField(allow_null=True)
    free_pct = serializers.FloatField(allow_null=True)
    read_bytes_per_second = serializers.FloatField(allow_null=True)
    written_bytes_per_second = serializers.FloatField(allow_null=True)
    io_busy_pct = serializers.FloatField(allow_null=True, help_text="local disks only")
    read_seconds_per_op = serializers.FloatField(allow_null=True, help_text="NFS READ mean response time")
    last_seen = serializers.DateTimeField(allow_null=True)
    jobs = PlacedJobSerializer(many=True)


class GpuServerReadsSerializer(serializers.Serializer):
    """A GPU server's read throughput against what a training server needs."""

    hostname = serializers.CharField()
    average_read_bytes_per_second = serializers.FloatField()
    peak_read_bytes_per_second = serializers.FloatField()
    need_bytes_per_second = serializers.FloatField()
    training = serializers.BooleanField()
    below_need = serializers.BooleanField()
    reported = serializers.BooleanField()
    jobs = PlacedJobSerializer(many=True)


class StorageTotalsSerializer(serializers.Serializer):
    mounts = serializers.IntegerField()
    low_free = serializers.IntegerField()
    servers = serializers.IntegerField()
    training_servers = serializers.IntegerField()
    servers_below_need = serializers.IntegerField()


class StorageSnapshotAnswerSerializer(serializers.Serializer):
    """GET /api/v1/storage/: mounts, GPU servers' reads against the need, and their totals."""

    ts = serializers.DateTimeField()
    window = CustomWindowSerializer()
    need_bytes_per_second = serializers.ListField(child=serializers.FloatField(), help_text="[low, high]")
    totals = StorageTotalsSerializer()
    mounts = MountSerializer(many=True)
    servers = GpuServerReadsSerializer(many=True)
