"""Serving detectors through the real rollups and incident engine: burn-rate edges (14.3x does not
page, 14.5x does, and only when both windows burn), queueing collapse, KV-cache exhaustion with and
without a prompt-length shift, cold starts, and quality regressions that name their change."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from fleet.models import Endpoint, EndpointChange, EndpointEval, Site
from fleet.serving import rollups as serving_rollups
from fleet.serving import slo as serving
from fleet.serving.store import ServingPoint, store_serving_points
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident

pytestmark = pytest.mark.django_db

SERVING = [
    "serving-queueing-collapse",
    "serving-kv-exhaustion",
    "serving-cold-start",
    "serving-quality-regression",
    "serving-burn-rate",
]
# A fixed minute of the hour (window edges are the same every run), two hours back (inside retention).
NOW = (timezone.now() - timedelta(hours=2)).replace(minute=30, second=30, microsecond=0)
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
TTFT_LE = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PROMPT_LE = (100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


class Server:
    """One simulated vLLM server's cumulative series, stored as ServingPoints scrape by scrape."""

    def __init__(self, site: Site, name: str = MODEL) -> None:
        self.site, self.name = site, name
        self.counters: dict[tuple[str, str], float] = {}
        self.points: list[ServingPoint] = []

    def add(self, metric: str, series: str, increase: float) -> None:
        self.counters[(metric, series)] = self.counters.get((metric, series), 0.0) + increase

    def observe(self, metric: str, bounds: tuple[float, ...], values: dict[float, float]) -> None:
        """Observations per bucket (upper bound -> count) into a cumulative histogram."""
        running = 0.0
        for le in (*bounds, math.inf):
            running += values.get(le, 0.0)
            self.add(f"{metric}_bucket", f'le="{_le(le)}"', running)
        self.add(f"{metric}_count", "", running)

    def scrape(self, ts: datetime, **gauges: float) -> None:
        for (metric, series), value in self.counters.items():
            self.points.append(ServingPoint(self.name, "vllm", self.name, ts, metric, series, value))
        names = {"waiting": "vllm:num_requests_waiting", "running": "vllm:num_requests_running"}
        names["kv"] = "vllm:kv_cache_usage_perc"
        for key, value in gauges.items():
            self.points.append(ServingPoint(self.name, "vllm", self.name, ts, names[key], "", value))

    def store(self) -> Endpoint:
        for start in range(0, len(self.points), 20_000):
            chunk = self.points[start : start + 20_000]
            store_serving_points(site_id=self.site.pk, batch_key=str(uuid.uuid4()), points=chunk)
        self.points = []
        serving_rollups.roll_everything(now=NOW)
        return Endpoint.objects.get(site=self.site, name=self.name)


def _requests(server: Server, ok: float, failed: float) -> None:
    server.add("vllm:request_success_total", 'finished_reason="stop"', ok)
    server.add("vllm:request_success_total", 'finished_reason="error"', failed)


def _availability_history(server: Server, recent: Callable[[int], float], *, minutes: int = 70) -> None:
    """Three days of clean traffic (a scrape every 5 minutes, 10,000 requests a minute), then the
    last ``minutes`` scraped every minute with ``recent(minutes_before_now)`` errors in each."""
    end = NOW.replace(second=0)
    t = end - timedelta(days=3, minutes=minutes + 10)
    while t < end - timedelta(minutes=minutes):
        _requests(server, 50_000, 0)
        server.scrape(t)
        t += timedelta(minutes=5)
    for before in range(minutes, -1, -1):
        errors = recent(before)
        _requests(server, 10_000 - errors, errors)
        server.scrape(end - timedelta(minutes=before))


def _burn_findings() -> list[Finding]:
    return list(Finding.objects.filter(source="detector:serving-burn-rate", status="firing"))


def test_an_error_ratio_of_14_3x_on_both_windows_does_not_page(site_a: Site) -> None:
    server = Server(site_a)
    _availability_history(server, lambda before: 143)  # 1.43 % errors = 14.3 x the 0.1 % allowed
    server.store()
    run_detectors(now=NOW, only=SERVING)
    assert _burn_findings() == []
    assert Incident.objects.count() == 0


def test_14_5x_on_both_windows_pages_with_the_budget_burned_in_the_impact(site_a: Site) -> None:
    server = Server(site_a)
    _availability_history(server, lambda before: 145)
    endpoint = server.store()
    run_detectors(now=NOW, only=SERVING)
    [finding] = _burn_findings()
    assert finding.severity == "SEV2"
    assert finding.fingerprint == f"serving-burn-rate:{endpoint.pk}:availability"
    assert finding.labels["endpoint"] == str(endpoint.pk) and finding.labels["slo"] == "availability"
    impact = finding.impact
    assert impact["rule"] == "fast_burn" and impact["alert"] == "page"
    assert impact["long_burn"] == pytest.approx(14.5, abs=0.01)
    assert impact["short_burn"] == pytest.approx(14.5, abs=0.01)
    # 14.5 x for 1 h of a 30-day budget: 14.5 / 720 of it.
    assert impact["budget_spent"] == pytest.approx(14.5 / 720, abs=1e-4)
    assert "availability SLO" in finding.summary and "14.5x over 1h" in finding.summary
    assert "over 14.4x on both" in finding.summary
    [incident] = Incident.objects.all()
    assert incident.error_budget_burned == pytest.approx(14.5 / 720, abs=1e-4)
    assert incident.group_key == f"endpoint={endpoint.pk}"


def test_a_long_window_burning_without_the_short_one_does_not_page(site_a: Site) -> None:
    # 16 x for 55 minutes, then 5 clean minutes: the hour burns at 14.7 x, the 5 minutes at 0.
    server = Server(site_a)
    _availability_history(server, lambda before: 160 if before >= 5 else 0, minutes=60)
    server.store()
    run_detectors(now=NOW, only=SERVING)
    assert _burn_findings() == []


def test_a_short_window_burning_without_the_long_one_does_not_page(site_a: Site) -> None:
    # 20 x for the last 5 minutes only: the hour burns at 1.7 x.
    server = Server(site_a)
    _availability_history(server, lambda before: 200 if before < 5 else 0, minutes=60)
    server.store()
    run_detectors(now=NOW, only=SERVING)
    assert _burn_findings() == []


def test_a_slow_burn_over_6h_and_3d_is_a_ticket_not_a_page(site_a: Site) -> None:
    # 2 x (0.2 % errors) for three days: over 1 x on 3 d and 6 h, far under 6 x.
    server = Server(site_a)
    end = NOW.replace(second=0)
    t = end - timedelta(days=3, minutes=10)
    while t <= end:
        _requests(server, 49_900, 100)
        server.scrape(t)
        t += timedelta(minutes=5)
    server.store()
    run_detectors(now=NOW, only=SERVING)
    [finding] = _burn_findings()
    assert finding.severity == "SEV4"
    assert finding.impact["rule"] == "slow_burn" and finding.impact["alert"] == "ticket"
    assert finding.impact["burn_rates"]["3d"] == pytest.approx(2.0, abs=0.05)


def _collapse(server: Server, *, growth: bool) -> None:
    """30 minutes of 100 requests a minute answered in under 250 ms, then (``growth``) six minutes
    whose queue grows by 20 a minute while TTFT moves to 2.5-5 s."""
    end = NOW.replace(second=0)
    for before in range(36, -1, -1):
        t = end - timedelta(minutes=before)
        collapsing = growth and before < 6
        _requests(server, 100, 0)
        server.observe("vllm:time_to_first_token_seconds", TTFT_LE, {5.0 if collapsing else 0.25: 100})
        waiting = 20.0 * (6 - before) if collapsing else 1.0
        server.scrape(t, waiting=waiting, running=64, kv=0.6)


def test_a_queueing_collapse_opens_one_incident_naming_it(site_a: Site) -> None:
    server = Server(site_a)
    _collapse(server, growth=True)
    endpoint = server.store()
    run_detectors(now=NOW, only=SERVING)
    [finding] = Finding.objects.filter(source="detector:serving-queueing-collapse")
    assert finding.labels == {
        "site": site_a.name,
        "endpoint": str(endpoint.pk),
        "endpoint_name": MODEL,
        "model": MODEL,
        "detector": "serving-queueing-collapse",
    }
    assert "Queueing collapse" in finding.summary
    assert "waiting queue 1 -> 100 over 5 min" in finding.summary
    assert finding.impact["arrivals_per_s"] > finding.impact["completions_per_s"]
    assert finding.impact["ttft_p99_ms"] > 2 * finding.impact["ttft_p99_before_ms"]
    [incident] = Incident.objects.all()
    assert "Queueing collapse" in incident.title


def test_a_short_steady_queue_is_not_a_collapse(site_a: Site) -> None:
    server = Server(site_a)
    _collapse(server, growth=False)
    server.store()
    run_detectors(now=NOW, only=SERVING)
    assert not Finding.objects.exists()


def _prompts(server: Server, median_bucket: float) -> dict[float, float]:
    """100 prompts: most in ``median_bucket``, a tail in the next bucket up."""
    i = PROMPT_LE.index(median_bucket)
    return {median_bucket: 80, PROMPT_LE[i + 1]: 20}


def _kv_history(server: Server, *, shifted: bool) -> None:
    """A day of prompts around 500 tokens (a scrape every 5 minutes), then 30 minutes scraped
    every minute; the last 8 with the cache at 97 % and preemptions, prompts ``shifted`` to 2,000."""
    end = NOW.replace(second=0)
    t = end - timedelta(days=1)
    while t < end - timedelta(minutes=30):
        server.observe("vllm:request_prompt_tokens", PROMPT_LE, _prompts(server, 500.0))
        server.add("vllm:num_preemptions_total", "", 0)
        server.scrape(t, waiting=0, running=40, kv=0.5)
        t += timedelta(minutes=5)
    for before in range(30, -1, -1):
        full = before < 8
        bucket = 2000.0 if full and shifted else 500.0
        server.observe("vllm:request_prompt_tokens", PROMPT_LE, _prompts(server, bucket))
        server.add("vllm:num_preemptions_total", "", 25 if full else 0)
        server.scrape(end - timedelta(minutes=before), waiting=0, running=40, kv=0.97 if full else 0.5)


def test_kv_exhaustion_after_a_prompt_length_shift_opens_one_incident_naming_the_shift(site_a: Site) -> None:
    server = Server(site_a)
    _kv_history(server, shifted=True)
    endpoint = server.store()
    run_detectors(now=NOW, only=SERVING)
    [finding] = Finding.objects.filter(source="detector:serving-kv-exhaustion")
    assert finding.labels["endpoint"] == str(endpoint.pk)
    assert "KV-cache exhaustion" in finding.summary and "preemptions" in finding.summary
    assert "prompt lengths shifted" in finding.summary
    impact = finding.impact
    assert impact["prompt_shift"] is True
    assert impact["prompt_p90"] >= 1.5 * impact["prompt_baseline_p90"]
    assert f"p90 {impact['prompt_baseline_p90']:,.0f} -> {impact['prompt_p90']:,.0f} tokens" in finding.summary
    assert impact["preemptions"] == 125
    [incident] = Incident.objects.all()
    assert "KV-cache exhaustion" in incident.title


def test_kv_exhaustion_without_a_shift_says_there_is_none(site_a: Site) -> None:
    server = Server(site_a)
    _kv_history(server, shifted=False)
    server.store()
    run_detectors(now=NOW, only=SERVING)
    [finding] = Finding.objects.filter(source="detector:serving-kv-exhaustion")
    assert "no prompt-length shift" in finding.summary
    assert finding.impact["prompt_shift"] is False


def test_kv_exhaustion_holds_at_92_percent_and_clears_under_90(site_a: Site) -> None:
    server = Server(site_a)
    _kv_history(server, shifted=False)
    server.store()
    run_detectors(now=NOW, only=SERVING)
    assert Finding.objects.filter(source="detector:serving-kv-exhaustion", status="firing").count() == 1
    later = NOW + timedelta(minutes=1)
    server.add("vllm:num_preemptions_total", "", 0)
    server.scrape(later.replace(second=0) - timedelta(seconds=1), waiting=0, running=40, kv=0.92)
    server.scrape(later.replace(second=0), waiting=0, running=40, kv=0.92)
    server.store()
    serving_rollups.roll_everything(now=later + timedelta(minutes=1))
    run_detectors(now=later + timedelta(minutes=1), only=SERVING)
    assert Finding.objects.filter(source="detector:serving-kv-exhaustion", status="firing").count() == 1
    after = later + timedelta(minutes=1)
    server.scrape(after.replace(second=0), waiting=0, running=40, kv=0.6)
    server.store()
    serving_rollups.roll_everything(now=after + timedelta(minutes=1))
    run_detectors(now=after + timedelta(minutes=1), only=SERVING)
    assert Finding.objects.filter(source="detector:serving-kv-exhaustion", status="firing").count() == 0


def _endpoint(site: Site, name: str = MODEL) -> Endpoint:
    return Endpoint.objects.create(site=site, name=name, framework="vllm", model_name=name)


def test_a_replica_slow_to_load_is_a_cold_start_naming_its_duration(site_a: Site) -> None:
    endpoint = _endpoint(site_a)
    slow = EndpointChange.objects.create(
        endpoint=endpoint, kind="replica_load", ts=NOW - timedelta(minutes=20), ready_at=NOW - timedelta(minutes=13)
    )
    EndpointChange.objects.create(
        endpoint=endpoint, kind="replica_load", ts=NOW - timedelta(minutes=10), ready_at=NOW - timedelta(minutes=7)
    )
    run_detectors(now=NOW, only=SERVING)
    [finding] = Finding.objects.filter(source="detector:serving-cold-start")
    assert finding.fingerprint == f"serving-cold-start:{slow.pk}"
    assert "load-to-ready took 7.0 min (threshold 5.0 min)" in finding.summary
    assert finding.impact["load_to_ready_s"] == 420
    # An hour after it was ready it is history, not a finding.
    run_detectors(now=NOW + timedelta(minutes=50), only=SERVING)
    assert not Finding.objects.filter(source="detector:serving-cold-start", status="firing").exists()


def test_a_scale_out_ready_after_the_load_peak_says_capacity_arrived_after_the_peak(site_a: Site) -> None:
    server = Server(site_a)
    end = NOW.replace(second=0)
    # Load rises to a peak 12 minutes ago, then falls; the scale-out began at 18 and was ready at 4.
    for before in range(40, -1, -1):
        rate = 3000 - 150 * abs(before - 12)
        _requests(server, rate, 0)
        server.scrape(end - timedelta(minutes=before))
    endpoint = server.store()
    change = EndpointChange.objects.create(
        endpoint=endpoint, kind="scale_out", ts=end - timedelta(minutes=18), ready_at=end - timedelta(minutes=14)
    )
    run_detectors(now=NOW, only=SERVING)
    assert not Finding.objects.filter(source="detector:serving-cold-start").exists()  # ready before the peak
    change.ready_at = end - timedelta(minutes=4)
    change.save()
    run_detectors(now=NOW, only=SERVING)
    [finding] = Finding.objects.filter(source="detector:serving-cold-start")
    assert "capacity arrived after the peak" in finding.summary
    assert "8.0 min after the load peaked" in finding.summary
    assert finding.impact["peak_at"] == (end - timedelta(minutes=12)).isoformat()


def _evals(endpoint: Endpoint, times: list[datetime], score: float, **fields: object) -> None:
    for t in times:
        EndpointEval.objects.create(
            endpoint=endpoint,
            ts=t,
            suite=str(fields.get("suite", "mmlu")),
            metric=str(fields.get("metric", "accuracy")),
            score=score,
            higher_is_better=bool(fields.get("higher_is_better", True)),
        )


def test_a_quality_drop_after_a_quantisation_change_opens_one_incident_naming_the_change(site_a: Site) -> None:
    endpoint = _endpoint(site_a)
    hours = [NOW - timedelta(hours=h) for h in (6, 5, 4, 3, 2)]
    _evals(endpoint, hours[:1], 0.60)  # older than the baseline's last three: not in it
    _evals(endpoint, hours[1:], 0.71)
    _evals(endpoint, hours, 0.79, suite="gsm8k", metric="exact_match")
    change = EndpointChange.objects.create(
        endpoint=endpoint, kind="quantisation", ts=NOW - timedelta(minutes=50), from_value="fp16", to_value="awq-int4"
    )
    _evals(endpoint, [NOW - timedelta(minutes=40), NOW - timedelta(minutes=20)], 0.67)
    _evals(endpoint, [NOW - timedelta(minutes=40)], 0.785, suite="gsm8k", metric="exact_match")  # within 2 %
    run_detectors(now=NOW, only=SERVING)
    [finding] = Finding.objects.filter(source="detector:serving-quality-regression")
    assert finding.fingerprint == f"serving-quality-regression:{endpoint.pk}:{change.pk}"
    assert "after the quantisation change fp16 -> awq-int4" in finding.summary
    assert "mmlu/accuracy 0.71 -> 0.67 (5.6% worse)" in finding.summary
    assert [r["suite"] for r in finding.impact["regressions"]] == ["mmlu"]
    assert finding.impact["change_kind"] == "quantisation" and finding.impact["to"] == "awq-int4"
    [incident] = Incident.objects.all()
    assert "quantisation change fp16 -> awq-int4" in incident.title


def test_a_lower_is_better_metric_regresses_when_it_rises(site_a: Site) -> None:
    endpoint = _endpoint(site_a)
    before = [NOW - timedelta(hours=h) for h in (3, 2)]
    _evals(endpoint, before, 5.0, suite="wikitext", metric="perplexity", higher_is_better=False)
    EndpointChange.objects.create(endpoint=endpoint, kind="kernel", ts=NOW - timedelta(hours=1), to_value="fa3")
    _evals(endpoint, [NOW - timedelta(minutes=30)], 4.5, suite="wikitext", metric="perplexity", higher_is_better=False)
    run_detectors(now=NOW, only=SERVING)
    assert not Finding.objects.exists()  # perplexity fell: better
    _evals(endpoint, [NOW - timedelta(minutes=10)], 6.5, suite="wikitext", metric="perplexity", higher_is_better=False)
    run_detectors(now=NOW, only=SERVING)  # mean after: 5.5, 10 % worse
    [finding] = Finding.objects.filter(source="detector:serving-quality-regression")
    assert "kernel change" in finding.summary and "wikitext/perplexity" in finding.summary


def test_a_rollback_that_restores_the_scores_clears_the_regression(site_a: Site) -> None:
    endpoint = _endpoint(site_a)
    _evals(endpoint, [NOW - timedelta(hours=h) for h in (5, 4, 3)], 0.71)
    EndpointChange.objects.create(endpoint=endpoint, kind="model", ts=NOW - timedelta(hours=2), to_value="v2")
    _evals(endpoint, [NOW - timedelta(minutes=90)], 0.66)
    run_detectors(now=NOW, only=SERVING)
    assert Finding.objects.filter(status="firing").count() == 1
    EndpointChange.objects.create(endpoint=endpoint, kind="model", ts=NOW - timedelta(minutes=60), to_value="v1")
    _evals(endpoint, [NOW - timedelta(minutes=30)], 0.71)
    run_detectors(now=NOW, only=SERVING)
    assert Finding.objects.filter(status="firing").count() == 0


def test_a_minute_without_a_scrape_does_not_end_a_firing_collapse_or_exhaustion() -> None:
    from fleet.serving.detectors import Minute, kv_exhaustion, queueing_collapse

    t0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    minutes = [
        Minute(t0 + timedelta(minutes=i), waiting=20.0 + 5 * i, running=64, kv=0.97, finished=100, preemptions=3)
        for i in range(8)
    ]
    gap = [*minutes[:-1], Minute(minutes[-1].bucket)]  # the last minute has no scrape
    assert queueing_collapse(gap, was_firing=False, ttft_threshold_s=0.5) is None
    held = queueing_collapse(gap, was_firing=True, ttft_threshold_s=0.5)
    assert held is not None and held.waiting_to == 50.0
    assert kv_exhaustion(gap, was_firing=False) is None
    kept = kv_exhaustion(gap, was_firing=True)
    assert kept is not None and kept.usage_last == pytest.approx(0.97)
    # A queue that drained before the gap lets the collapse go.
    drained = [*minutes[:-2], Minute(minutes[-2].bucket, waiting=0.0, running=10), Minute(minutes[-1].bucket)]
    assert queueing_collapse(drained, was_firing=True, ttft_threshold_s=0.5) is None


# --- when a burn starts, and on how much data -------------------------------------------------------


def _new_endpoint_failing(server: Server, *, clean_minutes: int, failing_minutes: int) -> datetime:
    """A new endpoint: its first scrape (which only starts the counters), ``clean_minutes`` of
    10,000 good requests, then ``failing_minutes`` with half of them failing, the last one the
    minute of NOW. Returns the first failing minute."""
    end = NOW.replace(second=0)
    minutes = clean_minutes + failing_minutes
    _requests(server, 0, 0)
    server.scrape(end - timedelta(minutes=minutes))
    for before in range(minutes - 1, -1, -1):
        failing = before < failing_minutes
        _requests(server, 5_000 if failing else 10_000, 5_000 if failing else 0)
        server.scrape(end - timedelta(minutes=before))
    return end - timedelta(minutes=failing_minutes - 1)


def test_a_burn_rate_incident_starts_at_the_first_minute_that_breached_not_before_the_data(site_a: Site) -> None:
    # Data since 4 minutes before NOW's minute (5 minutes to the end of it: the fast rule's short
    # window is covered); NOW - 5 min, the old start, was 30 s before the first data.
    server = Server(site_a)
    first_failing = _new_endpoint_failing(server, clean_minutes=2, failing_minutes=3)
    endpoint = server.store()
    run_detectors(now=NOW, only=SERVING)
    [finding] = _burn_findings()
    assert finding.impact["rule"] == "fast_burn"
    assert finding.started_at == first_failing
    assert Incident.objects.get().started_at == first_failing
    first_data = NOW.replace(second=0) - timedelta(minutes=4)
    assert finding.started_at >= first_data
    assert serving.slo_status(endpoint, now=NOW)["coverage"]["since"] == first_data.isoformat()


def test_the_slo_page_and_the_incident_engine_fire_on_the_same_data(site_a: Site, viewer_client) -> None:
    # Two minutes of a new endpoint failing half its requests: every window burns at 500x, and
    # neither the page nor the engine calls it an alert before the data spans a rule's short window.
    server = Server(site_a)
    _new_endpoint_failing(server, clean_minutes=0, failing_minutes=2)
    endpoint = server.store()
    status = serving.slo_status(endpoint, now=NOW)
    assert status["availability"]["windows"]["5m"]["burn_rate"] == pytest.approx(500.0)
    assert status["availability"]["alerts"] == []
    run_detectors(now=NOW, only=SERVING)
    assert _burn_findings() == []
    # Six minutes of it: the fast rule's 5 minutes are covered (the medium rule's 30 are not), and
    # both fire it.
    later = NOW + timedelta(minutes=4)
    for before in range(3, -1, -1):
        _requests(server, 5_000, 5_000)
        server.scrape(later.replace(second=0) - timedelta(minutes=before))
    for chunk in range(0, len(server.points), 20_000):
        store_serving_points(
            site_id=site_a.pk, batch_key=str(uuid.uuid4()), points=server.points[chunk : chunk + 20_000]
        )
    serving_rollups.roll_everything(now=later)
    status = serving.slo_status(endpoint, now=later)
    assert [a["rule"] for a in status["availability"]["alerts"]] == ["fast_burn"]
    run_detectors(now=later, only=SERVING)
    assert [f.impact["rule"] for f in _burn_findings()] == ["fast_burn"]
