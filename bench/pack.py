"""Compliance pack: a 366-day pack over a million audit entries, built by a real Celery worker, with
the worker's resident memory sampled throughout (issue 22, item 11: under 300 MB).

Data (in the bench database, ``bench_pack`` unless BENCH_DATABASE_URL says otherwise; Redis
database 12 unless BENCH_REDIS_URL says otherwise, flushed at the start): ``--entries`` (1,000,000)
audit entries spread evenly over 2025-01-01 .. 2026-01-01 (366 days), shaped like the console's
own: people, tokens and ``system`` changing reservations, incidents, nodes and GPUs, with before
and after images of about 0.3 to 0.5 kB, some exports, client addresses. They are inserted by SQL
(the app's write path is not what is measured) 10,000 a statement, each sealed into the audit
chain as it commits, and kept for the next run (``--reload`` inserts them afresh).

Phases:

1. start a Celery worker as production runs it (``--pool=threads --concurrency=4``) and sample
   its process tree's RSS every 0.2 s: ``worker_rss_idle_mb`` before the request;
2. request the pack (``request_pack``, the API's path) and wait for it: ``pack_s`` is the row's
   ``finished_at - created_at``, ``worker_rss_mb`` the worker's largest RSS meanwhile;
3. check the stored zip, read back a chunk at a time: every file's SHA-256 against the manifest,
   and audit.csv holds every entry (``zip_mb``).

Ends with RESULT entries=... pack_s=... worker_rss_mb=... and more k=v pairs. Target:
worker_rss_mb < 300.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import threading
import time
import zipfile
from datetime import date, datetime, timedelta
from typing import Any

os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_pack")
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")

from _common import BENCH_REDIS_URL, Processes, bench_env, log, setup_django

START, END = date(2025, 1, 1), date(2026, 1, 1)  # 366 days, both included
TARGET_RSS_MB = 300
# Entries a statement (each statement its own transaction): every entry is sealed into the audit
# chain as its transaction commits, as the console's own are.
INSERT_BATCH = 10_000

INSERT_SQL = """
INSERT INTO compliance_auditentry
    (at, actor_id, actor, action, app_label, model, object_id, object_repr, before, after, message, remote_addr)
SELECT %(start)s + (g::bigint * %(step_us)s::bigint) * interval '1 microsecond',
       CASE WHEN g %% 5 < 3 THEN 1 + g %% 40 END,
       (ARRAY['cora', 'olga', 'sre-bot (token)', 'system', 'priya'])[1 + g %% 5],
       (ARRAY['update', 'create', 'update', 'delete', 'export', 'update'])[1 + g %% 6],
       CASE WHEN g %% 3 = 0 THEN 'incidents' ELSE 'fleet' END,
       (ARRAY['reservation', 'incident', 'node', 'gpu', 'timelineentry'])[1 + g %% 5],
       (g %% 50000)::text,
       'Object ' || (g %% 50000) || ' at site ' || (ARRAY['ams-1', 'iad-2', 'sin-1'])[1 + g %% 3],
       CASE WHEN g %% 6 IN (1, 4) THEN NULL ELSE jsonb_build_object(
           'status', 'requested', 'gpus', g %% 64, 'team', 'team-' || (g %% 8), 'pool', 'pool-' || (g %% 20),
           'starts_at', '2025-03-01T00:00:00+00:00', 'ends_at', '2025-03-15T00:00:00+00:00',
           'notes', repeat('n', 40 + g %% 120)) END,
       CASE WHEN g %% 6 IN (3, 4) THEN NULL ELSE jsonb_build_object(
           'status', 'approved', 'gpus', g %% 64, 'team', 'team-' || (g %% 8), 'pool', 'pool-' || (g %% 20),
           'starts_at', '2025-03-01T00:00:00+00:00', 'ends_at', '2025-03-15T00:00:00+00:00',
           'notes', repeat('n', 40 + g %% 120), 'approved_by', 'olga') END,
       CASE WHEN g %% 6 = 4 THEN 'Downloaded goodput-compliance-pack-' || g || '.zip' ELSE '' END,
       ('10.' || (g %% 200) || '.' || (g %% 250) || '.' || (1 + g %% 253))::inet
FROM generate_series(%(lo)s, %(hi)s) AS g
"""


def period_bounds() -> tuple[datetime, datetime]:
    from compliance.services.pack import period_bounds as bounds

    return bounds(START, END)


def audit_count() -> int:
    from compliance.models import AuditEntry

    start, end = period_bounds()
    return AuditEntry.objects.filter(at__gte=start, at__lt=end).count()


def load_entries(entries: int, reload: bool) -> None:
    """``entries`` audit entries in the period, kept between runs unless ``reload``."""
    from django.db import connection

    have = audit_count()
    if have == entries and not reload:
        log(f"reusing {have:,} audit entries in {START} .. {END}")
        return
    started = time.monotonic()
    start, end = period_bounds()
    step_us = int((end - start) / timedelta(microseconds=1) // entries)
    with connection.cursor() as cursor:
        # The bench's own database: emptied as its owner (the table's triggers refuse a DELETE).
        cursor.execute("TRUNCATE compliance_auditentry CASCADE")
        for lo in range(0, entries, INSERT_BATCH):
            hi = min(entries, lo + INSERT_BATCH) - 1
            cursor.execute(INSERT_SQL, {"start": start, "step_us": step_us, "lo": lo, "hi": hi})
            if (hi + 1) % 100_000 == 0 or hi + 1 == entries:
                log(f"inserted {hi + 1:,} of {entries:,} audit entries")
        cursor.execute("VACUUM ANALYZE compliance_auditentry")
    log(f"{audit_count():,} audit entries ready in {time.monotonic() - started:.0f} s")


class RssSampler(threading.Thread):
    """The worker tree's resident memory (sum over its processes), every 0.2 s: the latest and the max."""

    def __init__(self, procs: Processes) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.latest = self.max = 0
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.done.wait(0.2):
            rss = 0
            for p in self.procs.tree("worker"):
                with contextlib.suppress(psutil.Error):
                    rss += p.memory_info().rss
            self.latest, self.max = rss, max(self.max, rss)

    def reset(self) -> None:
        self.max = self.latest


def start_worker(procs: Processes, concurrency: int) -> None:
    import redis

    redis.Redis.from_url(BENCH_REDIS_URL).flushdb()
    procs.spawn(
        "worker",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            "--pool=threads",
            f"--concurrency={concurrency}",
            "--loglevel=WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        bench_env(),
    )
    procs.wait_until("worker", lambda: "[goodput:worker]" in procs.log_text("worker"))


def build(procs: Processes, rss: RssSampler, timeout: float) -> Any:
    from compliance.choices import PackStatus
    from compliance.models import CompliancePack
    from compliance.services.pack import request_pack

    # Packs of earlier runs go: one still queued or running would be built after (or before) this one.
    CompliancePack.objects.all().delete()
    rss.reset()
    pack = request_pack(period_start=START, period_end=END)
    log(f"requested pack #{pack.pk}")
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        pack.refresh_from_db()
        if pack.status in (PackStatus.DONE, PackStatus.FAILED):
            break
        if pack.step != last:
            last = pack.step
            log(f"  {pack.progress:3d} % {pack.step} (worker RSS {rss.latest / 2**20:.0f} MiB)")
        procs.wait_until("worker", lambda: True, timeout=1)  # raises if the worker died
        time.sleep(0.5)
    time.sleep(0.4)  # one more sample after the end
    if pack.status != PackStatus.DONE:
        raise RuntimeError(f"pack #{pack.pk} is {pack.status} after {timeout:.0f} s: {pack.error or pack.step}")
    return pack


def check_zip(pack: Any, entries: int) -> None:
    """The stored zip, read back a chunk at a time: the manifest's sums and every audit entry."""
    from compliance.services.pack import zip_chunks

    with tempfile.TemporaryFile() as out:
        sha = hashlib.sha256()
        for chunk in zip_chunks(pack.pk):
            out.write(chunk)
            sha.update(chunk)
        if (sha.hexdigest(), out.tell()) != (pack.sha256, pack.size):
            raise RuntimeError("the stored zip does not match the pack's SHA-256 and size")
        out.seek(0)
        archive = zipfile.ZipFile(out)
        manifest = json.loads(archive.read("manifest.json"))
        for f in manifest["files"]:
            digest, size = hashlib.sha256(), 0
            with archive.open(f["name"]) as member:
                while data := member.read(1 << 20):
                    digest.update(data)
                    size += len(data)
            if (digest.hexdigest(), size) != (f["sha256"], f["size"]):
                raise RuntimeError(f"{f['name']} does not match the manifest")
        with archive.open("audit.csv") as member:
            rows = sum(1 for _ in io.TextIOWrapper(member, encoding="utf-8", newline="")) - 1
        if rows != entries:  # no entry holds a line break: one line each
            raise RuntimeError(f"audit.csv holds {rows:,} rows, not {entries:,}")
        sizes = {f["name"]: f["size"] for f in manifest["files"]}
        log(
            f"zip {pack.size / 2**20:.0f} MiB checked: pack.json {sizes['pack.json'] / 2**20:.0f} MiB, "
            f"audit.csv {sizes['audit.csv'] / 2**20:.0f} MiB ({rows:,} rows), every SHA-256 as in the manifest"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="audit entries in the period (1,000,000)")
    parser.add_argument("--reload", action="store_true", help="insert the audit entries afresh")
    parser.add_argument("--concurrency", type=int, default=4, help="the worker's --concurrency (threads, 4)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the pack (1800)")
    args = parser.parse_args()

    setup_django()
    load_entries(args.entries, args.reload)
    procs = Processes()
    rss = RssSampler(procs)
    try:
        start_worker(procs, args.concurrency)
        rss.start()
        time.sleep(3)
        idle = rss.latest
        log(f"worker (--pool=threads --concurrency={args.concurrency}) idle at {idle / 2**20:.0f} MiB")
        pack = build(procs, rss, args.timeout)
        pack_s = (pack.finished_at - pack.created_at).total_seconds()
        log(f"pack #{pack.pk} built in {pack_s:.1f} s; worker RSS max {rss.max / 2**20:.0f} MiB")
        check_zip(pack, args.entries)
    finally:
        rss.done.set()
        procs.stop()
    procs.discard_logs()
    verdict = "met" if rss.max / 2**20 < TARGET_RSS_MB else "MISSED"
    print(
        f"RESULT entries={args.entries} pack_s={pack_s:.1f} worker_rss_mb={rss.max / 2**20:.0f} "
        f"worker_rss_idle_mb={idle / 2**20:.0f} zip_mb={pack.size / 2**20:.1f} target_rss_mb={TARGET_RSS_MB} {verdict}"
    )


if __name__ == "__main__":
    main()
