"""Velero's metrics (tests/fixtures/velero*.prom, written from Velero's documentation and
pkg/metrics) mapped to backup reports: a last-success timestamp is a successful run, an increase
of the failure counter a failed one; repeated scrapes write nothing twice; a schedule maps to the
items of the pushing token's site that name it; and through the Prometheus door the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.test import Client

from compliance import detectors
from compliance.choices import BackupMethod, RecoveryKind
from compliance.models import BackupReport, RecoveryItem
from compliance.services import velero
from fleet.models import Site
from tests.compliance.recovery_support import make_item

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIRST = (FIXTURES / "velero.prom").read_text()
LATER = (FIXTURES / "velero-later.prom").read_text()
SCRAPED = datetime(2025, 12, 6, 0, 30, tzinfo=UTC)  # the first fixture's scrape
DOOR = "/api/v1/ingest/prometheus"


@pytest.fixture
def items(site_a: Site, site_b: Site) -> dict[str, RecoveryItem]:
    def item(name: str, kind: str, schedule: str) -> RecoveryItem:
        return make_item(
            site_a,
            name=name,
            kind=kind,
            method=BackupMethod.VELERO,
            schedule=schedule,
            copy_site=site_b,
            copy_tier="object-store",
        )

    return {
        "datasets": item("datasets-pvc", RecoveryKind.DATASET, "datasets-nightly"),
        "checkpoints": item("checkpoints-pvc", RecoveryKind.CHECKPOINTS, "checkpoints-hourly"),
        "weights": item("weights-pvc", RecoveryKind.MODEL_WEIGHTS, "weights-6h"),
    }


def runs(item: RecoveryItem) -> list[tuple[str, str, datetime]]:
    return list(item.backups.order_by("finished").values_list("external_id", "outcome", "finished"))


def test_the_fixture_reads_as_velero_documents_its_series() -> None:
    schedules, started = velero.read_scrape(FIRST)
    assert started == 1764892800.0  # process_start_time_seconds
    assert set(schedules) == {"datasets-nightly", "checkpoints-hourly", "weights-6h"}  # "" (by hand) left out
    nightly = schedules["datasets-nightly"]
    assert (nightly.last_success, nightly.last_status, nightly.failures) == (1764979200.0, 1.0, 0.0)
    assert nightly.tarball_bytes == 7_340_032_000
    assert schedules["weights-6h"].last_success == 0.0  # never succeeded


def test_a_last_successful_timestamp_is_a_successful_run_with_the_copy_where_the_item_says(
    items: dict[str, RecoveryItem], site_a: Site, site_b: Site
) -> None:
    figures = velero.map_scrape(FIRST, site_id=site_a.pk, received=SCRAPED)
    assert figures == {"backup_reports": 4, "schedules": 3, "unmapped_schedules": []}
    [(run, outcome, finished)] = runs(items["datasets"])
    assert (run, outcome, finished) == (
        "velero:datasets-nightly:success:1764979200",
        "success",
        datetime(2025, 12, 6, tzinfo=UTC),
    )
    report = items["datasets"].backups.get()
    assert (report.bytes, report.copy_site, report.copy_tier) == (7_340_032_000, site_b, "object-store")


def test_a_failed_latest_run_is_recorded_after_the_last_success_and_without_its_size(
    items: dict[str, RecoveryItem], site_a: Site
) -> None:
    velero.map_scrape(FIRST, site_id=site_a.pk, received=SCRAPED)
    checkpoints = runs(items["checkpoints"])
    assert [(r, o) for r, o, _ in checkpoints] == [
        ("velero:checkpoints-hourly:success:1764975600", "success"),
        ("velero:checkpoints-hourly:failed:1764892800:3", "failed"),  # only the latest of a counter first seen
    ]
    assert checkpoints[1][2] == SCRAPED
    assert items["checkpoints"].backups.get(outcome="success").bytes is None  # the tarball is the failed run's
    assert [(r, o) for r, o, _ in runs(items["weights"])] == [("velero:weights-6h:failed:1764892800:1", "failed")]


def test_repeated_scrapes_write_nothing_twice(items: dict[str, RecoveryItem], site_a: Site) -> None:
    velero.map_scrape(FIRST, site_id=site_a.pk, received=SCRAPED)
    again = velero.map_scrape(FIRST, site_id=site_a.pk, received=SCRAPED + timedelta(minutes=1))
    assert again["backup_reports"] == 0
    assert BackupReport.objects.count() == 4


def test_the_next_scrape_adds_each_new_failure_and_the_new_success_and_the_finding_fires(
    items: dict[str, RecoveryItem], site_a: Site
) -> None:
    velero.map_scrape(FIRST, site_id=site_a.pk, received=SCRAPED)
    later = velero.map_scrape(LATER, site_id=site_a.pk, received=SCRAPED + timedelta(hours=1))
    assert later["backup_reports"] == 3  # checkpoints: failures 4 and 5; weights: its first success
    failed = [r for r, o, _ in runs(items["checkpoints"]) if o == "failed"]
    assert failed == [f"velero:checkpoints-hourly:failed:1764892800:{n}" for n in (3, 4, 5)]
    weights = runs(items["weights"])
    assert [o for _, o, _ in weights] == ["failed", "success"]  # the failure came before the success
    assert weights[-1][2] == datetime(2025, 12, 6, 1, tzinfo=UTC)
    now = SCRAPED + timedelta(hours=1)
    firing = {s.labels["recovery_item"] for s in detectors.recovery_backup_failing(now)}
    assert firing == {"checkpoints-pvc"}
    assert {s.labels["recovery_item"] for s in detectors.recovery_rpo_breached(now)} == set()


def test_a_restarted_velero_counts_its_failures_anew_without_colliding(
    items: dict[str, RecoveryItem], site_a: Site
) -> None:
    velero.map_scrape(FIRST, site_id=site_a.pk, received=SCRAPED)
    restarted = FIRST.replace("process_start_time_seconds 1.7648928e+09", "process_start_time_seconds 1.7649e+09")
    velero.map_scrape(restarted, site_id=site_a.pk, received=SCRAPED + timedelta(hours=2))
    assert items["weights"].backups.filter(outcome="failed").count() == 2  # run 1 of each process


def test_schedules_map_only_to_the_token_sites_items(items: dict[str, RecoveryItem], site_b: Site) -> None:
    figures = velero.map_scrape(FIRST, site_id=site_b.pk, received=SCRAPED)
    assert figures["backup_reports"] == 0
    assert figures["unmapped_schedules"] == ["checkpoints-hourly", "datasets-nightly", "weights-6h"]
    assert not BackupReport.objects.exists()


def test_a_velero_scrape_pushed_to_the_prometheus_door_becomes_backup_reports(
    client: Client, items: dict[str, RecoveryItem], token_a: str
) -> None:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token_a}"}
    response = client.post(DOOR, FIRST, content_type="text/plain; version=0.0.4", **headers)
    assert response.status_code == 202, response.content
    assert response.json()["mapped"]["velero"]["backup_reports"] == 4
    again = client.post(DOOR, FIRST, content_type="text/plain; version=0.0.4", **headers)
    assert again.status_code == 202 and again.json()["mapped"]["velero"]["backup_reports"] == 0
    assert BackupReport.objects.count() == 4


def test_a_velero_scrape_target_maps_its_scrapes_as_the_door_does(
    items: dict[str, RecoveryItem], site_a: Site, settings
) -> None:
    """A scrape target of Velero's /metrics (kind auto): each scrape is mapped like a push."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from fleet.models import ScrapeTarget
    from fleet.tasks import schedule_scrapes

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = FIRST.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        target = ScrapeTarget.objects.create(site=site_a, name="velero", url=url)
        assert schedule_scrapes() == 1  # eager: the scrape runs now
        target.refresh_from_db()
        assert target.health == "up", target.last_error
        assert BackupReport.objects.count() == 4
        ScrapeTarget.objects.filter(pk=target.pk).update(next_scrape_at=target.last_scrape_at)
        assert schedule_scrapes() == 1
        assert BackupReport.objects.count() == 4  # the same scrape again: nothing twice
    finally:
        server.shutdown()
        server.server_close()


def test_a_push_without_velero_series_is_untouched_by_the_mapping(client: Client, token_a: str) -> None:
    response = client.post(
        DOOR, "go_goroutines 3\n", content_type="text/plain; version=0.0.4", HTTP_AUTHORIZATION=f"Bearer {token_a}"
    )
    assert response.status_code == 400  # nothing this console stores, as before
    assert "mapped" not in response.json()


def test_values_no_backup_could_have_are_ignored_not_a_500(
    client: Client, items: dict[str, RecoveryItem], token_a: str
) -> None:
    long_name = "s" * 300
    hostile = "\n".join(
        [
            "process_start_time_seconds 1e300",
            'velero_backup_last_successful_timestamp{schedule="datasets-nightly"} 9e15',  # year 285 million
            'velero_backup_last_successful_timestamp{schedule="weights-6h"} NaN',
            'velero_backup_failure_total{schedule="checkpoints-hourly"} 1e300',
            'velero_backup_tarball_size_bytes{schedule="datasets-nightly"} -5',
            f'velero_backup_failure_total{{schedule="{long_name}"}} 2',
            "",
        ]
    )
    response = client.post(
        DOOR, hostile, content_type="text/plain; version=0.0.4", HTTP_AUTHORIZATION=f"Bearer {token_a}"
    )
    assert response.status_code == 202, response.content
    assert response.json()["mapped"]["velero"]["backup_reports"] == 0
    assert not BackupReport.objects.exists()
