"""The console's own /metrics: Prometheus text for a role or an agent token, nothing for others."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import make_sample, post_batch


def metrics(client, **extra) -> dict[str, list]:  # type: ignore[no-untyped-def]
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.status_code
    assert response["Content-Type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(response.content.decode())}


def test_metrics_need_a_role_or_a_token(anon_client, norole_client, viewer_client, token_a) -> None:
    assert anon_client.get("/metrics").status_code == 401
    assert norole_client.get("/metrics").status_code == 403
    assert anon_client.get("/metrics", HTTP_AUTHORIZATION="Bearer gp_nope_nope").status_code == 401
    assert "goodput_broker_up" in metrics(viewer_client)
    assert "goodput_broker_up" in metrics(anon_client, HTTP_AUTHORIZATION=f"Bearer {token_a}")


def test_metrics_report_ingest_rate_rejections_latency_and_scrapes(client, viewer_client, token_a) -> None:
    assert post_batch(client, token_a, {"samples": [make_sample(), make_sample()]}).status_code == 202
    assert post_batch(client, token_a, {"samples": [make_sample(gpu_util=400)]}).status_code == 400
    families = metrics(viewer_client)
    accepted = {s.labels["kind"]: s.value for s in families["goodput_ingest_accepted"]}
    assert accepted == {"gpu_samples": 1}
    rejected = {s.labels["reason"]: s.value for s in families["goodput_ingest_rejected"]}
    assert rejected == {"http_400": 1}
    assert families["goodput_ingest_samples_stored"][0].value == 2
    assert families["goodput_ingest_samples_per_second"][0].value == 2 / 60
    assert {s.labels["quantile"] for s in families["goodput_ingest_task_latency_seconds"]} == {"0.5", "0.95", "1"}
    assert families["goodput_ingest_queue_depth"][0].value == 0
    assert "goodput_rollup_lag_seconds" in families and "goodput_scrape_target_up" in families
    assert families["goodput_serving_rollup_lag_seconds"][0].value == 0
