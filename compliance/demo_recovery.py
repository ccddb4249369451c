"""The recovery register for `make demo`: the demo's datasets (linked to the compliance register),
checkpoints per training cluster, the demo model's weights and the console's own database, each
with a week of backup reports up to now and restore tests, one item overdue for its restore test
(demo-licensed-news: last verified 130 days ago, the period is 92).

Idempotent: items are keyed by name; backup reports by run id (each start fills the slots since
the last start, so the backups keep "reporting"); restore tests are written only with a new item,
so a restart leaves what people recorded alone. Figures are plausible: replication moves a day's
changes (well under 1 % of a dataset), checkpoint snapshots take minutes, weights a few hundred GB.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from compliance.choices import BackupMethod, BackupOutcome, RecoveryKind
from compliance.models import BackupReport, Dataset, RecoveryItem, RestoreTest
from compliance.services.recovery import CONSOLE_DATABASE_NAME

WEEK = timedelta(days=7)
OVERDUE = "demo-licensed-news"
TB = 10**12
# dataset name -> (bytes held, source site)
DATASET_BYTES = {
    "demo-web-crawl-2026": (7.2 * TB, "ams-1"),
    "demo-open-books": (0.84 * TB, "ams-1"),
    "demo-licensed-news": (0.19 * TB, "iad-2"),
    "demo-support-chats": (0.004 * TB, "iad-2"),
    "demo-synthetic-math": (0.05 * TB, "ams-1"),
    "demo-image-captions": (1.6 * TB, "iad-2"),
}
OTHER_SITE = {"ams-1": "iad-2", "iad-2": "ams-1", "sin-1": "ams-1"}


def _slots(now: datetime, every: timedelta, offset: timedelta) -> list[datetime]:
    """The finish times of the schedule's runs in the week before ``now`` (each ``every``, from
    midnight + offset). A run is reported once it has finished, and no later: with a margin, every
    item showed its RPO breached on a demo started in the minutes after its slot a day on."""
    first = (now - WEEK).replace(hour=0, minute=0, second=0, microsecond=0) + offset
    slots, at = [], first
    while at <= now:
        if at >= now - WEEK:
            slots.append(at)
        at += every
    return slots


def _backups(item: RecoveryItem, now: datetime, every: timedelta, offset: timedelta, size: float, minutes: int) -> int:
    """A report per slot of the week not reported yet; returns how many were added."""
    rows = []
    for n, finished in enumerate(_slots(now, every, offset)):
        wobble = 1 + 0.15 * ((n * 7919) % 11 - 5) / 5  # deterministic ±15 % in size and duration
        rows.append(
            BackupReport(
                item=item,
                external_id=f"demo-{item.name}-{finished:%Y%m%dT%H%M}",
                started=finished - timedelta(minutes=minutes * wobble),
                finished=finished,
                bytes=int(size * wobble),
                outcome=BackupOutcome.SUCCESS,
                copy_site=item.copy_site,
                copy_tier=item.copy_tier,
            )
        )
    before = item.backups.count()
    BackupReport.objects.bulk_create(rows, ignore_conflicts=True)  # a slot reported before stays as it was
    return item.backups.count() - before


def _test(item: RecoveryItem, finished: datetime, minutes: int, into: str, how: str, by: str) -> None:
    RestoreTest.objects.create(
        item=item,
        by_name=by,
        into=into,
        started=finished - timedelta(minutes=minutes),
        finished=finished,
        verified=True,
        verification=how,
        backup=item.backups.filter(finished__lte=finished).order_by("-finished").first(),
    )


def seed_recovery(*, now: datetime) -> int:
    """Write the demo's register where missing; returns the backup reports added."""
    from fleet.models import Job, Site

    sites = {s.name: s for s in Site.objects.filter(name__in=["ams-1", "iad-2", "sin-1"])}
    if not sites:
        return 0  # no demo fleet: nothing to place the items on
    added = 0

    def item(name: str, **fields: object) -> tuple[RecoveryItem, bool]:
        return RecoveryItem.objects.get_or_create(name=name, defaults=fields)

    for n, (name, (size, site)) in enumerate(DATASET_BYTES.items()):
        dataset = Dataset.objects.filter(name=name).first()
        source = sites.get(site) or next(iter(sites.values()))
        entry, created = item(
            name,
            kind=RecoveryKind.DATASET,
            dataset=dataset,
            source_site=source,
            source_tier="object-store",
            location=f"s3://datasets/{name}/",
            method=BackupMethod.REPLICATION,
            copy_site=sites.get(OTHER_SITE.get(source.name, "")),
            copy_tier="object-store",
        )
        added += _backups(entry, now, timedelta(days=1), timedelta(hours=2, minutes=5 * n), size * 0.004, 35)
        if created:
            days = 130 if name == OVERDUE else 20 + 9 * n
            _test(
                entry,
                now - timedelta(days=days, hours=3),
                90,
                f"scratch bucket s3://restore-tests/{name}/",
                "sha256 of every shard matched the manifest",
                "Dana (data platform)",
            )

    clusters = Job.objects.exclude(cluster="").values_list("cluster", "site_id").distinct().order_by("cluster")
    for cluster, site_id in clusters:
        source = next((s for s in sites.values() if s.pk == site_id), None)
        if source is None:
            continue
        entry, created = item(
            f"checkpoints-{cluster}",
            kind=RecoveryKind.CHECKPOINTS,
            cluster=cluster,
            source_site=source,
            source_tier="lustre",
            location=f"/lustre/{cluster}/checkpoints/",
            method=BackupMethod.SNAPSHOT,
            rpo=timedelta(hours=6),
            copy_site=source,
            copy_tier="object-store",
        )
        added += _backups(entry, now, timedelta(hours=4), timedelta(minutes=30), 2.6 * TB, 12)
        if created:
            _test(
                entry,
                now - timedelta(days=11, hours=5),
                48,
                f"/lustre/{cluster}/restore-test/",
                "Resumed a 70B job from the restored checkpoint: loss matched at step +10",
                "Sam (training SRE)",
            )

    weights_site = sites.get("iad-2") or next(iter(sites.values()))
    entry, created = item(
        "goodput-demo-7b-1.0-weights",
        kind=RecoveryKind.MODEL_WEIGHTS,
        source_site=weights_site,
        source_tier="object-store",
        location="s3://models/goodput-demo-7b/1.0",
        method=BackupMethod.OBJECT_STORE_VERSIONING,
        copy_site=sites.get(OTHER_SITE[weights_site.name]),
        copy_tier="object-store",
    )
    added += _backups(entry, now, timedelta(days=1), timedelta(hours=3), 15 * 10**9, 6)
    if created:
        _test(
            entry,
            now - timedelta(days=20, hours=1),
            12,
            "sin-1 serving canary",
            "The model loaded and its eval set's perplexity matched to 4 decimals",
            "Ravi (serving SRE)",
        )

    entry, created = item(
        CONSOLE_DATABASE_NAME,
        kind=RecoveryKind.CONSOLE_DATABASE,
        method=BackupMethod.MANAGE_PY_BACKUP,
        location="DATA_DIR/backups",
        copy_site=sites.get("iad-2"),
        copy_tier="object-store",
    )
    added += _backups(entry, now, timedelta(days=1), timedelta(hours=1), 38 * 10**9, 9)
    if created:
        _test(
            entry,
            now - timedelta(days=30, hours=2),
            26,
            "restore-test database on the staging server",
            "manage.py restore: every table's row count and checksum matched the manifest",
            "ops (manage.py)",
        )
    return added
