"""Velero's Prometheus metrics mapped to the recovery register's backup reports.

Velero's server (pkg/metrics) labels its backup series by ``schedule`` (the Schedule's name; ""
for a backup made by hand, which no item names). Of them this reads:

* ``velero_backup_last_successful_timestamp`` (gauge, Unix seconds; 0 until one succeeded): each
  new value is one successful run, reported as ``velero:<schedule>:success:<timestamp>`` and
  finishing then. Velero does not say when that run started, so ``started`` is ``finished``;
* ``velero_backup_failure_total`` and ``velero_backup_partial_failure_total`` (counters): each
  increase is a failed (partial) run, ``velero:<schedule>:failed:<lifetime>:<count>``, finishing
  when the scrape first saw it (before the last success when ``velero_backup_last_status`` says the
  latest run succeeded). A counter restarts with the Velero process: ``process_start_time_seconds``
  (the Go client's) names the lifetime, so run 1 of a new process is not run 1 of the last one;
* ``velero_backup_tarball_size_bytes``: the last backup's size, given to a success that is the
  latest run (``velero_backup_last_status`` 1).

A schedule maps to the register's items whose ``schedule`` names it, at the pushing token's site;
their declared copy site and tier go on the reports (Velero's metrics do not say where the copy
lives). Repeated scrapes are idempotent: a run id already recorded is left as it is.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from compliance.choices import BackupOutcome
from compliance.models import BackupReport, RecoveryItem
from compliance.services import recovery
from fleet.validation import IngestError

PREFIX = "velero_backup_"
LAST_SUCCESS = "velero_backup_last_successful_timestamp"
LAST_STATUS = "velero_backup_last_status"
FAILURES = "velero_backup_failure_total"
PARTIAL_FAILURES = "velero_backup_partial_failure_total"
TARBALL = "velero_backup_tarball_size_bytes"
PROCESS_START = "process_start_time_seconds"
READ = {LAST_SUCCESS, LAST_STATUS, FAILURES, PARTIAL_FAILURES, TARBALL}
# A jump of more failures than this between two scrapes records only the latest this many: enough
# for recovery-backup-failing to judge, without a row per failure of a counter first seen at 500.
FAILURES_KEPT = recovery.FAILING_RUNS
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)  # a timestamp before this is no backup of ours
# Larger values are no count or size of ours (and would not fit a run id or a bigint): not read.
COUNT_MAX = 2**53
SCHEDULE_MAX = 100  # RecoveryItem.schedule's length: a run id (velero:<schedule>:...) stays within 200


@dataclass
class Schedule:
    """One schedule's figures in a scrape; None: the series was not there (or held no number)."""

    last_success: float | None = None
    last_status: float | None = None
    failures: float | None = None
    partial_failures: float | None = None
    tarball_bytes: float | None = None


def read_scrape(text: str, *, openmetrics: bool = False) -> tuple[dict[str, Schedule], float | None]:
    """Velero's figures per schedule, and the process start time (None when not exposed)."""
    schedules: dict[str, Schedule] = defaultdict(Schedule)
    started = None
    attribute = {
        LAST_SUCCESS: "last_success",
        LAST_STATUS: "last_status",
        FAILURES: "failures",
        PARTIAL_FAILURES: "partial_failures",
        TARBALL: "tarball_bytes",
    }
    try:
        # The door parsed this text already with the same parser; a second read that fails anyway
        # is refused as the door refuses a bad exposition, never a 500.
        families = list(openmetrics_families(text) if openmetrics else text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
        raise IngestError(400, f"Velero's series cannot be read: {exc}") from None
    for family in families:
        for sample in family.samples:
            value = float(sample.value)
            if not math.isfinite(value) or not 0 <= value < COUNT_MAX:
                continue  # no reading
            if sample.name == PROCESS_START:
                started = value
            elif sample.name in READ and sample.labels.get("schedule"):
                setattr(schedules[sample.labels["schedule"]], attribute[sample.name], value)
    return dict(schedules), started


def _moment(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _failed_runs(item: RecoveryItem, schedule: str, kind: str, lifetime: str, count: float | None) -> list[int]:
    """The counts of this lifetime's failed runs not recorded yet (the latest FAILURES_KEPT)."""
    if not count:
        return []
    prefix = f"velero:{schedule}:{kind}:{lifetime}:"
    seen = [
        int(run.removeprefix(prefix))
        for run in BackupReport.objects.filter(item=item, external_id__startswith=prefix).values_list(
            "external_id", flat=True
        )
        if run.removeprefix(prefix).isdigit()
    ]
    latest = int(count)
    first = max(seen) + 1 if seen else latest
    return list(range(max(first, latest - FAILURES_KEPT + 1), latest + 1))


def reports_for(
    item: RecoveryItem, schedule: str, figures: Schedule, *, lifetime: str, received: datetime
) -> list[dict[str, Any]]:
    """The reports one schedule's figures make for one item, not yet recorded (run id and figures)."""
    reports: list[dict[str, Any]] = []
    latest_ok = figures.last_status == 1
    success_at = None
    latest_moment = (received + recovery.CLOCK_SKEW).timestamp()
    if figures.last_success and EARLIEST.timestamp() <= figures.last_success <= latest_moment:
        success_at = _moment(figures.last_success)
        reports.append(
            {
                "external_id": f"velero:{schedule}:success:{int(figures.last_success)}",
                "started": success_at,
                "finished": success_at,
                "bytes": int(figures.tarball_bytes) if latest_ok and figures.tarball_bytes is not None else None,
                "outcome": BackupOutcome.SUCCESS,
            }
        )
    # A failure seen now finished by now; when the latest run succeeded, before that success.
    failed_by = min(received, success_at - timedelta(seconds=1)) if latest_ok and success_at else received
    for kind, outcome, count in (
        ("failed", BackupOutcome.FAILED, figures.failures),
        ("partial", BackupOutcome.PARTIAL, figures.partial_failures),
    ):
        runs = _failed_runs(item, schedule, kind, lifetime, count)
        for n in runs:
            at = failed_by - timedelta(seconds=runs[-1] - n)  # one second apart, in the counter's order
            reports.append(
                {
                    "external_id": f"velero:{schedule}:{kind}:{lifetime}:{n}",
                    "started": at,
                    "finished": at,
                    "bytes": None,
                    "outcome": outcome,
                }
            )
    return reports


def map_scrape(text: str, *, site_id: int, received: datetime, openmetrics: bool = False) -> dict[str, Any]:
    """Record the backup reports a Velero scrape says, for the items at ``site_id`` that name its
    schedules; {"backup_reports": new reports, "schedules": schedules seen, "unmapped_schedules": [...]}."""
    schedules, process_start = read_scrape(text, openmetrics=openmetrics)
    plausible = process_start and EARLIEST.timestamp() <= process_start <= received.timestamp() + 86400
    lifetime = str(int(process_start)) if plausible else "0"
    items: dict[str, list[RecoveryItem]] = defaultdict(list)
    named = [name for name in schedules if len(name) <= SCHEDULE_MAX]
    for item in RecoveryItem.objects.filter(schedule__in=named, source_site_id=site_id):
        items[item.schedule].append(item)
    written = 0
    for schedule, figures in schedules.items():
        for item in items.get(schedule, []):
            for report in reports_for(item, schedule, figures, lifetime=lifetime, received=received):
                try:
                    _, created = recovery.record_backup(
                        item=item,
                        copy_site_id=item.copy_site_id,
                        copy_tier=item.copy_tier,
                        **report,
                    )
                except recovery.ReportConflict:
                    continue  # seen before by an earlier scrape, with a size since changed: the first stands
                written += created
    return {
        "backup_reports": written,
        "schedules": len(schedules),
        "unmapped_schedules": sorted(s for s in schedules if s not in items),
    }
