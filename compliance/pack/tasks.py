"""Building a compliance pack in the background (queued by compliance.services.pack.request_pack).

One pack is built at a time, whichever worker takes the message: the build holds a PostgreSQL
advisory lock (``PACK_BUILD_LOCK``) for as long as it runs, and the lock goes with the connection
if the worker dies. A build that finds it taken leaves its pack queued, says on the row what it
waits for, and ends; the build holding it starts the oldest queued pack when it finishes. Two
year-long packs at once would double the worker's memory and the database's read load, and the
second would finish no sooner.

The row is the task's only state: claimed with a conditional UPDATE, told its progress with cheap
conditional UPDATEs (a pack someone else finished or failed is left alone), and always left
``done`` or ``failed``, never ``running``. The zip goes to a temporary file as it is written and
is stored as the pack's chunks in the transaction that marks it done.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import tempfile
import threading
from collections.abc import Iterator

from celery import shared_task
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from compliance.choices import PackStatus
from compliance.models import CompliancePack
from compliance.services.pack import save_zip, waiting_step, write_pack

logger = logging.getLogger(__name__)

# The advisory lock key of the one pack build slot (any fixed 64-bit number no other lock uses:
# these are the bytes of "gpPACK01").
PACK_BUILD_LOCK = 0x6770_5041_434B_3031


@contextlib.contextmanager
def build_slot() -> Iterator[bool]:
    """Yields whether this process got the pack build slot; holds it until the block ends. The
    lock is the connection's (session level), so a worker that dies mid-build frees it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [PACK_BUILD_LOCK])
        ours = bool(cursor.fetchone()[0])
    try:
        yield ours
    finally:
        if ours:
            # A connection that broke has let go of the lock already.
            with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [PACK_BUILD_LOCK])


class _RowProgress:
    """Writes a build's progress to its row from a thread of its own, hence on a connection of
    its own: the build reads in one long transaction, and what it wrote there nobody would see
    until it ends. Only the latest report waiting is written."""

    def __init__(self, pack_id: int) -> None:
        self.running = CompliancePack.objects.filter(pk=pack_id, status=PackStatus.RUNNING)
        self._reports: queue.SimpleQueue[tuple[int, str] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"pack-{pack_id}-progress", daemon=True)
        self._thread.start()

    def __call__(self, percent: int, step: str) -> None:
        self._reports.put((percent, step))

    def _run(self) -> None:
        try:
            stop = False
            while not stop:
                report = self._reports.get()
                while report is not None and not self._reports.empty():
                    # Only the latest report waiting is worth a write.
                    later = self._reports.get()
                    if later is None:
                        stop = True
                        break
                    report = later
                if report is None:
                    return
                self._write(*report)
        finally:
            connection.close()  # this thread's own connection

    def _write(self, percent: int, step: str) -> None:
        try:
            self.running.filter(progress__lte=percent).update(progress=percent, step=step[:200])
        except DatabaseError:
            logger.warning("could not record a compliance pack's progress", exc_info=True)

    def close(self) -> None:
        """Write what is still waiting, then stop the thread."""
        if self._thread.is_alive():
            self._reports.put(None)
            self._thread.join(timeout=30)


@shared_task(name="compliance.tasks_pack.build_compliance_pack", ignore_result=True)
def build_compliance_pack(pack_id: int) -> str:
    """Build pack ``pack_id`` and store its zip, then start the oldest queued pack; returns the
    pack's status, "waiting" when another build holds the slot, or "skipped".

    A queued pack is claimed; so is a running one, since only a worker lost mid-build (the message
    comes back with acks_late) leaves one running, and building it again is harmless.
    """
    with build_slot() as ours:
        if not ours:
            CompliancePack.objects.filter(pk=pack_id, status=PackStatus.QUEUED).update(step=waiting_step(pack_id))
            return "waiting"
        status = _build(pack_id)
    _start_next()
    return status


def _start_next() -> None:
    """Queue the build of the oldest pack still waiting (its own message found the slot taken)."""
    waiting = CompliancePack.objects.filter(status=PackStatus.QUEUED).order_by("created_at", "pk").first()
    if waiting is not None:
        build_compliance_pack.delay(waiting.pk)


def _build(pack_id: int) -> str:
    # Holding the slot proves no other build is alive: another pack still running was being built
    # by a worker that died. It waits its turn again.
    CompliancePack.objects.filter(status=PackStatus.RUNNING).exclude(pk=pack_id).update(
        status=PackStatus.QUEUED, progress=0, step="Queued again: the worker building it stopped"
    )
    claimed = CompliancePack.objects.filter(pk=pack_id, status__in=(PackStatus.QUEUED, PackStatus.RUNNING)).update(
        status=PackStatus.RUNNING, progress=0, step="Starting", error=""
    )
    if not claimed:
        return "skipped"  # done, failed or gone: a redelivered message has nothing to do
    running = CompliancePack.objects.filter(pk=pack_id, status=PackStatus.RUNNING)
    progress = _RowProgress(pack_id)
    try:
        pack = CompliancePack.objects.get(pk=pack_id)
        with tempfile.TemporaryFile(prefix="goodput-pack-") as out:
            write_pack(pack, out, progress=progress)
            progress.close()
            running.update(progress=97, step="Storing the zip")
            with transaction.atomic():
                sha256, size = save_zip(pack_id, out)
                finished = running.update(
                    status=PackStatus.DONE,
                    progress=100,
                    step="Done",
                    sha256=sha256,
                    size=size,
                    finished_at=timezone.now(),
                )
                if not finished:
                    transaction.set_rollback(True)  # failed or finished meanwhile: keep no chunks
                    return "skipped"
    except Exception as exc:
        logger.exception("compliance pack %s failed", pack_id)
        progress.close()
        running.update(
            status=PackStatus.FAILED,
            step="Failed",
            error=f"{exc.__class__.__name__}: {exc}"[:2000],
            finished_at=timezone.now(),
        )
        return PackStatus.FAILED
    return PackStatus.DONE
