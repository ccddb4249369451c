"""One pack build at a time (issue 22, item 11): a pack requested while another builds waits in the
queue and says so, on the page and in the API; the build holding the slot starts the waiting
packs, oldest first, when it ends. The slot is a PostgreSQL advisory lock, so "another build" is
another database session holding it (here a second connection, as another worker would)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test import Client

from compliance.choices import PackStatus
from compliance.models import CompliancePack
from compliance.pack.tasks import PACK_BUILD_LOCK, build_compliance_pack
from tests.compliance.test_pack_build import END, START, make_pack_records

PACKS = "/api/v1/compliance/packs/"
PAGE = "/compliance/packs/"
BODY = {"period_start": START.isoformat(), "period_end": END.isoformat()}

pytestmark = pytest.mark.django_db


@contextmanager
def other_session() -> Iterator[psycopg.Connection[Any]]:
    """A second session on the test database, as another worker's would be."""
    s = connection.settings_dict
    with psycopg.connect(
        dbname=s["NAME"], host=s["HOST"] or None, port=s["PORT"] or None, user=s["USER"], password=s["PASSWORD"] or None
    ) as conn:
        yield conn


@contextmanager
def slot_held_elsewhere() -> Iterator[None]:
    with other_session() as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [PACK_BUILD_LOCK])
        yield


def test_a_pack_requested_while_another_builds_waits_and_the_page_says_so(
    officer_client: Client, django_capture_on_commit_callbacks
) -> None:
    building = CompliancePack.objects.create(period_start=START, period_end=END, status=PackStatus.RUNNING, progress=40)
    with slot_held_elsewhere(), django_capture_on_commit_callbacks(execute=True):
        response = officer_client.post(PACKS, BODY, content_type="application/json")
    assert response.status_code == 202, response.content
    waiting = f"Waiting for pack #{building.pk} to finish (packs are built one at a time)"
    assert (response.json()["status"], response.json()["step"]) == ("queued", waiting)
    pack = CompliancePack.objects.get(pk=response.json()["id"])
    # The eager build ran on commit, found the slot taken and left the pack queued, untouched.
    assert (pack.status, pack.progress, pack.step) == (PackStatus.QUEUED, 0, waiting)
    assert not pack.chunks.exists()
    assert officer_client.get(f"{PACKS}{pack.pk}/").json()["step"] == waiting

    html = officer_client.get(PAGE).content.decode()
    assert "Packs are built one at a time" in html
    assert "1 pack waiting now." in html
    assert waiting in html


def test_a_build_that_finds_the_slot_taken_leaves_the_pack_queued_and_says_what_it_waits_for() -> None:
    first = CompliancePack.objects.create(period_start=START, period_end=END)
    second = CompliancePack.objects.create(period_start=START, period_end=END)
    with slot_held_elsewhere():
        assert build_compliance_pack(second.pk) == "waiting"
    second.refresh_from_db()
    assert second.status == PackStatus.QUEUED
    assert second.step == (
        "Waiting for the pack being built to finish, then 1 queued before this one (packs are built one at a time)"
    )
    first.refresh_from_db()
    assert (first.status, first.step) == (PackStatus.QUEUED, "")


def test_the_build_holding_the_slot_then_builds_the_waiting_packs_oldest_first() -> None:
    make_pack_records()
    # A pack left running by a worker that died: nobody holds the slot, so nobody builds it.
    orphan = CompliancePack.objects.create(period_start=START, period_end=END, status=PackStatus.RUNNING, progress=60)
    first = CompliancePack.objects.create(period_start=START, period_end=END)
    second = CompliancePack.objects.create(period_start=START, period_end=END)

    assert build_compliance_pack(first.pk) == PackStatus.DONE
    packs = {p.pk: p for p in CompliancePack.objects.all()}
    assert {p.status for p in packs.values()} == {PackStatus.DONE}
    assert all(p.chunks.exists() and p.size > 0 for p in packs.values())
    # The asked-for pack first, then the queue oldest first: the orphan queued again, then the second.
    order = sorted(packs.values(), key=lambda p: p.finished_at)
    assert [p.pk for p in order] == [first.pk, orphan.pk, second.pk]


def test_the_slot_is_free_again_after_a_build_and_after_a_failed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    make_pack_records()
    done = CompliancePack.objects.create(period_start=START, period_end=END)
    assert build_compliance_pack(done.pk) == PackStatus.DONE

    def broken(pack: CompliancePack, out: Any, *, progress: Any = None) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr("compliance.pack.tasks.write_pack", broken)
    failed = CompliancePack.objects.create(period_start=START, period_end=END)
    assert build_compliance_pack(failed.pk) == PackStatus.FAILED
    with other_session() as conn:
        assert conn.execute("SELECT pg_try_advisory_lock(%s)", [PACK_BUILD_LOCK]).fetchone() == (True,)
