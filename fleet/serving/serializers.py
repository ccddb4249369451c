from __future__ import annotations

from rest_framework import serializers

from console.schema import CustomWindowAnswerSerializer
from fleet.inventory.models import Gpu
from fleet.serving.models import Endpoint
from fleet.telemetry.models import ScrapeTarget


class EndpointSerializer(serializers.ModelSerializer):
    """An endpoint and what SREs set on it: where it serves from and its SLOs (targets in percent)."""

    site = serializers.SlugRelatedField(slug_field="name", read_only=True)
    gpus = serializers.SlugRelatedField(
        slug_field="uuid",
        many=True,
        required=False,
        queryset=Gpu.objects.select_related("node"),
        help_text="UUIDs of its GPUs",
    )
    scrape_targets = serializers.PrimaryKeyRelatedField(
        many=True, required=False, queryset=ScrapeTarget.objects.all(), help_text="Ids of its scrape targets"
    )

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "site",
            "name",
            "framework",
            "model_name",
            "version",
            "region",
            "replicas",
            "gpus",
            "scrape_targets",
            "ttft_threshold_ms",
            "ttft_target_pct",
            "itl_threshold_ms",
            "itl_target_pct",
            "availability_target_pct",
            "slo_window_days",
            "created_at",
        ]
        # Registered by the metrics it reports: its identity (site, name) is not edited here.
        read_only_fields = ["name", "created_at"]

    def validate(self, attrs: dict) -> dict:
        site_id = self.instance.site_id if self.instance is not None else None
        if site_id is not None:
            foreign = sorted(g.uuid for g in attrs.get("gpus", []) if g.node.site_id != site_id)
            if foreign:
                raise serializers.ValidationError({"gpus": f"GPUs of another site: {', '.join(foreign[:5])}."})
            foreign_targets = sorted(t.pk for t in attrs.get("scrape_targets", []) if t.site_id != site_id)
            if foreign_targets:
                raise serializers.ValidationError(
                    {"scrape_targets": f"Scrape targets of another site: {', '.join(map(str, foreign_targets[:5]))}."}
                )
        return attrs


# --- the read models' answers (fleet.serving.slo and fleet.serving.read), for the schema ------
# The views answer with the read models' dicts; these classes describe them (nothing is serialized
# through them). Figures rounded or undefined for lack of traffic are null, not 0.


def _ms(help_text: str = "") -> serializers.FloatField:
    return serializers.FloatField(allow_null=True, help_text=help_text or "milliseconds; null without traffic")


class ServingSliWindowSerializer(serializers.Serializer):
    """An SLI over one window: good and all events, their ratio and the burn rate it means."""

    good = serializers.FloatField()
    total = serializers.FloatField()
    sli = serializers.FloatField(allow_null=True, help_text="good / total; null without traffic")
    burn_rate = serializers.FloatField(allow_null=True, help_text="error ratio / error budget")
    interpolated = serializers.BooleanField(help_text="the threshold fell between bucket bounds: an estimate")


class ServingBurnAlertSerializer(serializers.Serializer):
    """A multi-window burn-rate alert firing."""

    rule = serializers.CharField()
    severity = serializers.CharField(help_text="page or ticket")
    factor = serializers.FloatField()
    long_window = serializers.CharField()
    short_window = serializers.CharField()
    long_burn = serializers.FloatField()
    short_burn = serializers.FloatField()
    budget_spent = serializers.FloatField()


class ServingSloStatusSerializer(ServingSliWindowSerializer):
    """One SLO over its period: the SLI, budget left, the burn-rate windows and the alerts firing."""

    target_pct = serializers.FloatField()
    threshold_ms = serializers.FloatField(allow_null=True, help_text="null for availability")
    period_days = serializers.IntegerField()
    budget_left = serializers.FloatField(allow_null=True, help_text="share of the budget left; negative: overspent")
    windows = serializers.DictField(child=ServingSliWindowSerializer(), help_text="by window: 5m, 30m, 1h, 6h, 3d")
    alerts = ServingBurnAlertSerializer(many=True)


class ServingQuantilesSerializer(serializers.Serializer):
    """p50 / p90 / p99 of a latency histogram (ms) and its observation count."""

    p50 = _ms()
    p90 = _ms()
    p99 = _ms()
    count = serializers.FloatField()


class ServingLatencySerializer(serializers.Serializer):
    ttft = ServingQuantilesSerializer()
    itl = ServingQuantilesSerializer()
    e2e = ServingQuantilesSerializer()


class ServingCoverageSerializer(serializers.Serializer):
    """The data the SLO period's figures rest on."""

    since = serializers.DateTimeField(allow_null=True, help_text="the first data in the period")
    seconds = serializers.IntegerField()
    period_days = serializers.IntegerField()
    complete = serializers.BooleanField(help_text="the data covers the whole period")


class ServingSloSerializer(serializers.Serializer):
    ttft = ServingSloStatusSerializer()
    itl = ServingSloStatusSerializer()
    availability = ServingSloStatusSerializer()
    latency = serializers.DictField(child=ServingLatencySerializer(), help_text="by window: 5m ... 3d and period")
    coverage = ServingCoverageSerializer()


class ServingOutcomesSerializer(serializers.Serializer):
    requests_ok = serializers.FloatField()
    requests_failed = serializers.FloatField()
    requests_aborted = serializers.FloatField()


class ServingSinceStartSerializer(ServingLatencySerializer):
    """Figures since each server last started, from the latest scrape's cumulative series."""

    as_of = serializers.DateTimeField()
    requests = ServingOutcomesSerializer()
    failures_by_reason = serializers.DictField(child=serializers.FloatField())
    gauges = serializers.DictField(child=serializers.FloatField(), help_text="running, waiting, kv_cache_usage")


class ServingEndpointRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    site = serializers.CharField()


class EndpointSloAnswerSerializer(serializers.Serializer):
    """GET /api/v1/serving/endpoints/<id>/slo."""

    endpoint = ServingEndpointRefSerializer()
    generated_at = serializers.DateTimeField()
    slo = ServingSloSerializer()
    since_start = ServingSinceStartSerializer(allow_null=True, help_text="null without a scrape in ten minutes")


class ServingEndpointInfoSerializer(serializers.Serializer):
    """What an endpoint is and what SREs set on it."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    site = serializers.CharField()
    framework = serializers.CharField()
    framework_label = serializers.CharField()
    model = serializers.CharField()
    version = serializers.CharField()
    region = serializers.CharField()
    replicas = serializers.IntegerField()
    slo_window_days = serializers.IntegerField()
    url = serializers.CharField()


class ServingSloRowSerializer(serializers.Serializer):
    """An SLO as the pages' table shows it."""

    slo = serializers.CharField(help_text="ttft, itl or availability")
    label = serializers.CharField()
    short = serializers.CharField()
    target_pct = serializers.FloatField()
    threshold_ms = serializers.FloatField(allow_null=True)
    period_days = serializers.IntegerField()
    sli = serializers.FloatField(allow_null=True)
    good = serializers.FloatField()
    total = serializers.FloatField()
    budget_left = serializers.FloatField(allow_null=True)
    burn = serializers.DictField(child=serializers.FloatField(allow_null=True), help_text="burn rate by window")
    alerting_windows = serializers.ListField(child=serializers.CharField())
    alerts = ServingBurnAlertSerializer(many=True)
    interpolated = serializers.BooleanField()


class ServingSloAlertSerializer(ServingBurnAlertSerializer):
    slo = serializers.CharField()
    label = serializers.CharField()


class ServingNowSerializer(serializers.Serializer):
    """The last five minutes."""

    ttft_p50 = _ms()
    ttft_p99 = _ms()
    itl_p50 = _ms()
    itl_p99 = _ms()
    requests_5m = serializers.FloatField()
    rps = serializers.FloatField(allow_null=True)
    tokens_per_s = serializers.FloatField(allow_null=True)
    request_mean_ms = _ms("Triton's mean time per successful request; null for other frameworks")
    queue_mean_ms = _ms("Triton's mean queue time per successful request; null for other frameworks")
    compute_mean_ms = _ms("Triton's mean compute time per successful request; null for other frameworks")
    waiting = serializers.FloatField(allow_null=True, help_text="requests queued, latest")
    running = serializers.FloatField(allow_null=True)
    kv_cache_usage = serializers.FloatField(allow_null=True, help_text="0-1")
    kv_cache_usage_max = serializers.FloatField(allow_null=True)
    preemptions_5m = serializers.FloatField(allow_null=True)


def _column(help_text: str = "") -> serializers.ListField:
    return serializers.ListField(child=serializers.FloatField(allow_null=True), help_text=help_text)


class ServingSeriesSerializer(serializers.Serializer):
    """Chart columns, one value per point of ``t``; a null point is a gap or a figure without data."""

    t = serializers.ListField(child=serializers.DateTimeField())
    ttft_p50 = _column("ms")
    ttft_p99 = _column("ms")
    itl_p50 = _column("ms")
    itl_p99 = _column("ms")
    e2e_p50 = _column("ms")
    e2e_p99 = _column("ms")
    rps = _column()
    error_ratio = _column()
    tokens_per_s = _column()
    prompt_tokens_per_s = _column()
    preemptions = _column()
    prompt_p50 = _column("tokens")
    prompt_p90 = _column("tokens")
    waiting = _column("mean of the minutes' means")
    waiting_max = _column()
    running = _column()
    running_max = _column()
    kv_cache_usage = _column("0-1")
    kv_cache_usage_max = _column()
    request_mean_ms = _column("Triton")
    queue_mean_ms = _column("Triton")
    compute_mean_ms = _column("Triton")


class ServingSummarySerializer(serializers.Serializer):
    """An endpoint's SLO table, verdict, alerts and "now" figures."""

    slos = ServingSloRowSerializer(many=True)
    verdict = serializers.ChoiceField(choices=["meeting", "missing", "no_data"])
    alerts = ServingSloAlertSerializer(many=True)
    now = ServingNowSerializer()
    worst_budget_left = serializers.FloatField(allow_null=True)
    coverage = ServingCoverageSerializer()


class ServingEndpointCardSerializer(ServingEndpointInfoSerializer, ServingSummarySerializer):
    """One endpoint on the overview: identity, summary and the last hour's minute points."""

    series = ServingSeriesSerializer()


class ServingTotalsSerializer(serializers.Serializer):
    endpoints = serializers.IntegerField()
    meeting = serializers.IntegerField()
    missing = serializers.IntegerField()
    no_data = serializers.IntegerField()
    alerts = serializers.IntegerField()
    pages = serializers.IntegerField(help_text="alerts of severity page")
    worst_budget_left = serializers.FloatField(allow_null=True)


class ServingOverviewAnswerSerializer(serializers.Serializer):
    """GET /api/v1/serving/overview."""

    ts = serializers.DateTimeField()
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    burn_windows = serializers.ListField(child=serializers.CharField())
    endpoints = ServingEndpointCardSerializer(many=True)
    totals = ServingTotalsSerializer()


class ServingTargetsSerializer(serializers.Serializer):
    ttft_threshold_ms = serializers.FloatField()
    ttft_target_pct = serializers.FloatField()
    itl_threshold_ms = serializers.FloatField()
    itl_target_pct = serializers.FloatField()
    availability_target_pct = serializers.FloatField()


class ServingChangeRowSerializer(serializers.Serializer):
    ts = serializers.DateTimeField()
    kind = serializers.CharField()
    label = serializers.CharField()
    from_value = serializers.CharField(allow_blank=True)
    to_value = serializers.CharField(allow_blank=True)
    model_version = serializers.CharField(allow_blank=True)
    ready_at = serializers.DateTimeField(allow_null=True)
    load_to_ready_s = serializers.FloatField(allow_null=True)
    note = serializers.CharField(allow_blank=True)


class ServingEvalRowSerializer(serializers.Serializer):
    ts = serializers.DateTimeField()
    suite = serializers.CharField()
    metric = serializers.CharField()
    score = serializers.FloatField()
    model_version = serializers.CharField(allow_blank=True)
    higher_is_better = serializers.BooleanField()


class ServingPromptLengthsSerializer(serializers.Serializer):
    """The prompt-length distribution over the range against the 7 days before it."""

    bounds = _column("bucket upper bounds in tokens; null: +Inf")
    counts = serializers.ListField(child=serializers.FloatField())
    share = _column()
    baseline_share = _column()
    total = serializers.FloatField()
    baseline_total = serializers.FloatField()
    p50 = serializers.FloatField(allow_null=True)
    p90 = serializers.FloatField(allow_null=True)
    baseline_p50 = serializers.FloatField(allow_null=True)
    baseline_p90 = serializers.FloatField(allow_null=True)
    p50_ratio = serializers.FloatField(allow_null=True)
    p90_ratio = serializers.FloatField(allow_null=True)


class ServingRangeFiguresSerializer(serializers.Serializer):
    """Activity over the range, and Triton's failures by reason."""

    requests = serializers.FloatField(allow_null=True)
    rps = serializers.FloatField(allow_null=True)
    tokens_per_s = serializers.FloatField(allow_null=True)
    prompt_tokens_per_s = serializers.FloatField(allow_null=True)
    request_mean_ms = _ms("Triton")
    queue_mean_ms = _ms("Triton")
    compute_mean_ms = _ms("Triton")
    successes = serializers.FloatField(allow_null=True)
    failures_by_reason = serializers.DictField(child=serializers.FloatField(allow_null=True))


class EndpointSnapshotAnswerSerializer(CustomWindowAnswerSerializer, ServingSummarySerializer):
    """GET /api/v1/serving/endpoints/<id>/snapshot: an endpoint's page over a range."""

    ts = serializers.DateTimeField()
    ranges = serializers.ListField(child=serializers.CharField())
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    step_seconds = serializers.IntegerField()
    burn_windows = serializers.ListField(child=serializers.CharField())
    endpoint = ServingEndpointInfoSerializer()
    targets = ServingTargetsSerializer()
    series = ServingSeriesSerializer()
    since_start = ServingSinceStartSerializer(allow_null=True)
    changes = ServingChangeRowSerializer(many=True)
    evals = ServingEvalRowSerializer(many=True)
    prompt_lengths = ServingPromptLengthsSerializer()
    range_figures = ServingRangeFiguresSerializer()
