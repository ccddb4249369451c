from __future__ import annotations

from rest_framework import serializers

from console.schema import CustomWindowAnswerSerializer, CustomWindowSerializer
from fleet.inventory.models import Gpu, Site
from fleet.telemetry.fields import METRIC_NAMES
from fleet.telemetry.models import GpuState, ScrapeTarget, endpoint_name_missing


class GpuStateSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuState
        fields = ["ts", *METRIC_NAMES]


class MigInstanceSerializer(serializers.ModelSerializer):
    """A MIG instance as listed under its physical GPU."""

    class Meta:
        model = Gpu
        fields = ["uuid", "mig_profile", "mig_instance_id"]


class GpuSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)
    site = serializers.CharField(source="node.site.name", read_only=True)
    state = GpuStateSerializer(read_only=True, allow_null=True)
    parent = serializers.SlugRelatedField(
        slug_field="uuid", read_only=True, allow_null=True, help_text="The physical GPU of a MIG instance"
    )
    mig_instances = MigInstanceSerializer(many=True, read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "uuid",
            "index",
            "model",
            "hbm_gib",
            "node",
            "hostname",
            "site",
            "parent",
            "mig_profile",
            "mig_instance_id",
            "mig_instances",
            "state",
            "created_at",
        ]
        read_only_fields = ["uuid", "mig_profile", "mig_instance_id", "created_at"]


class ScrapeTargetSerializer(serializers.ModelSerializer):
    site = serializers.SlugRelatedField(slug_field="name", queryset=Site.objects.all())

    class Meta:
        model = ScrapeTarget
        fields = [
            "id",
            "site",
            "name",
            "url",
            "kind",
            "endpoint_name",
            "hostname",
            "interval_seconds",
            "timeout_seconds",
            "enabled",
            "health",
            "last_scrape_at",
            "last_duration_ms",
            "last_samples",
            "last_error",
            "next_scrape_at",
        ]
        read_only_fields = [
            "health",
            "last_scrape_at",
            "last_duration_ms",
            "last_samples",
            "last_error",
            "next_scrape_at",
        ]

    def validate(self, attrs: dict) -> dict:
        """The model's rule (ScrapeTarget.clean), on the values the save would leave: a PATCH of
        the kind alone is judged with the endpoint name already stored."""
        instance = self.instance
        kind = attrs.get("kind", instance.kind if instance else ScrapeTarget._meta.get_field("kind").default)
        name = attrs.get("endpoint_name", instance.endpoint_name if instance else "")
        if message := endpoint_name_missing(kind, name):
            raise serializers.ValidationError({"endpoint_name": message})
        return attrs


# --- the fleet page's read-model answers (fleet.telemetry.read.fleet_summary and dashboard), for the schema --
# The views answer with the read models' dicts; these classes only describe them.


def _figure(help_text: str = "") -> serializers.FloatField:
    return serializers.FloatField(allow_null=True, help_text=help_text or "null without a reporting GPU")


def _column(help_text: str = "") -> serializers.ListField:
    return serializers.ListField(child=serializers.FloatField(allow_null=True), help_text=help_text)


class GpuRowSerializer(serializers.Serializer):
    """A GPU's latest state as the fleet table draws it."""

    uuid = serializers.CharField()
    index = serializers.IntegerField()
    model = serializers.CharField()
    hostname = serializers.CharField()
    site_id = serializers.IntegerField()
    site = serializers.CharField()
    ts = serializers.DateTimeField(help_text="its newest sample")
    util = _figure("%")
    mem_used_pct = _figure("framebuffer used; a GPU in MIG mode: its instances'")
    temp = _figure("°C")
    mem_temp = _figure("°C")
    power_w = _figure()
    sm_clock = _figure("MHz")
    xid = serializers.IntegerField(allow_null=True)
    ecc_dbe = serializers.IntegerField(allow_null=True, help_text="double-bit ECC errors, total")
    open_xid_ecc = serializers.BooleanField(help_text="an open XID or ECC finding names it")
    throttle = serializers.IntegerField(allow_null=True, help_text="DCGM's clock throttle reasons bit mask")
    tensor = _figure("tensor-pipe activity, 0-1")


class HealthRowSerializer(GpuRowSerializer):
    health = serializers.ChoiceField(choices=["healthy", "degraded", "failed"])


class FleetTotalsSerializer(serializers.Serializer):
    """Totals over physical GPUs (of the fleet, or one site)."""

    gpus = serializers.IntegerField()
    reporting = serializers.IntegerField()
    stale = serializers.IntegerField()
    mean_util = _figure()
    power_kw = serializers.FloatField()
    max_temp = _figure()
    mean_temp = _figure()
    with_errors = serializers.IntegerField(help_text="GPUs with an open XID or ECC finding")
    throttled = serializers.IntegerField()
    hottest = GpuRowSerializer(many=True)
    healthy = serializers.IntegerField()
    failed = serializers.IntegerField()
    degraded = serializers.IntegerField()


class FleetSiteSerializer(serializers.Serializer):
    """One site's row."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    region = serializers.CharField(allow_blank=True)
    contracted_power_kw = _figure()
    gpus = serializers.IntegerField()
    nodes = serializers.IntegerField()
    reporting = serializers.IntegerField()
    mean_util = _figure()
    power_kw = serializers.FloatField()
    max_temp = _figure()
    mean_temp = _figure()
    with_errors = serializers.IntegerField()
    healthy = serializers.IntegerField()
    failed = serializers.IntegerField()
    degraded = serializers.IntegerField()


class GpuTablePageSerializer(serializers.Serializer):
    """Which page of the GPU table, and the live topic whose pushes carry its rows."""

    count = serializers.IntegerField(help_text="GPUs matching the filters")
    page = serializers.IntegerField()
    size = serializers.IntegerField()
    pages = serializers.IntegerField()
    sort = serializers.CharField()
    filters = serializers.DictField(child=serializers.CharField(), help_text="the filters given")
    topic = serializers.CharField()


class FleetTopicsSerializer(serializers.Serializer):
    fleet = serializers.CharField()
    view = serializers.CharField(help_text="the table page's topic")
    site = serializers.CharField(allow_null=True, help_text="the chosen site's topic")


class SiteSeriesSerializer(serializers.Serializer):
    ts = serializers.ListField(child=serializers.DateTimeField())
    util = _column("mean %")
    power_kw = _column()
    temp = _column("max °C")


class FleetSeriesSerializer(CustomWindowSerializer):
    """Per-site chart series; ``range``, ``from`` and ``to`` only for a custom window."""

    window_always_said = False
    range = serializers.CharField(required=False)
    bucket_seconds = serializers.IntegerField()
    range_seconds = serializers.IntegerField()
    resolution = serializers.CharField(help_text="raw, 1m or 1h")
    sites = serializers.DictField(child=SiteSeriesSerializer(), help_text="by site id")


class FleetOverviewAnswerSerializer(serializers.Serializer):
    """GET /api/v1/fleet/overview/: the fleet page's snapshot."""

    ts = serializers.DateTimeField()
    range = serializers.CharField(help_text='the preset read, or "custom"')
    totals = FleetTotalsSerializer()
    sites = FleetSiteSerializer(many=True)
    worst = HealthRowSerializer(many=True)
    gpus = HealthRowSerializer(many=True, help_text="one page of the GPU table")
    table = GpuTablePageSerializer()
    topics = FleetTopicsSerializer()
    series = FleetSeriesSerializer()


class GpuTableAnswerSerializer(GpuTablePageSerializer):
    """GET /api/v1/fleet/gpu-table/: one page; filtered to a site by id, also its worst GPUs."""

    gpus = HealthRowSerializer(many=True)
    site_topic = serializers.CharField(required=False)
    worst = HealthRowSerializer(many=True, required=False)


class SeriesMetaSerializer(CustomWindowAnswerSerializer):
    resolution = serializers.CharField(help_text="raw, 1m or 1h")
    bucket_seconds = serializers.IntegerField()
    range_seconds = serializers.IntegerField()
    ts = serializers.DateTimeField()
    keys = serializers.ListField(child=serializers.CharField(), help_text="the series charted")


class GpuRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    uuid = serializers.CharField()
    label = serializers.CharField()


class GpuSeriesSerializer(serializers.Serializer):
    """A GPU's points; a MIG instance has no temp or power_w of its own."""

    ts = serializers.ListField(child=serializers.DateTimeField())
    util = _column()
    temp = serializers.ListField(child=serializers.FloatField(allow_null=True), required=False)
    power_w = serializers.ListField(child=serializers.FloatField(allow_null=True), required=False)
    mem_used_pct = _column()


class GpuSeriesAnswerSerializer(SeriesMetaSerializer):
    """GET /api/v1/fleet/gpus/<uuid>/series/."""

    gpu = GpuRefSerializer()
    series = GpuSeriesSerializer()


class NodeGpuSeriesSerializer(serializers.Serializer):
    ts = serializers.ListField(child=serializers.DateTimeField())
    util = _column()
    temp = _column()
    power_w = _column()


class NodeGpuSerializer(GpuRefSerializer):
    series = NodeGpuSeriesSerializer()


class NodeRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    hostname = serializers.CharField()


class NodeSeriesAnswerSerializer(SeriesMetaSerializer):
    """GET /api/v1/fleet/nodes/<hostname>/series/: one series per physical GPU."""

    node = NodeRefSerializer()
    gpus = NodeGpuSerializer(many=True)
