"""`make demo` restarts: the admin keeps its password and the simulator keeps its tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from console.models import AgentToken
from fleet.management.commands.simulate import Command as SimulateCommand
from fleet.telemetry.simulator import DEFAULT_SEED, DEFAULT_SITES, build_fleet
from goodput.management.commands.demo import Command as DemoCommand

pytestmark = pytest.mark.django_db


@pytest.fixture
def data_dir(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    settings.DATA_DIR = tmp_path
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    return tmp_path


def test_first_start_creates_the_admin_with_a_saved_password(data_dir: Path) -> None:
    username, hint = DemoCommand()._ensure_admin()

    password = (data_dir / "demo_admin_password").read_text().strip()
    admin = User.objects.get(username=username)
    assert admin.check_password(password)
    assert admin.is_superuser and admin.groups.filter(name="Admin").exists()
    assert password in hint


def test_a_restart_keeps_an_existing_admins_password(data_dir: Path) -> None:
    DemoCommand()._ensure_admin()
    admin = User.objects.get(username="admin")
    admin.set_password("chosen-by-the-operator-42")
    admin.save()

    _, hint = DemoCommand()._ensure_admin()

    admin.refresh_from_db()
    assert admin.check_password("chosen-by-the-operator-42"), "the demo reset the admin's password"
    assert "changepassword admin" in hint
    assert (data_dir / "demo_admin_password").read_text().strip() not in hint


def test_a_restart_keeps_the_sessions_of_the_admin(data_dir: Path) -> None:
    """A password change rotates the session auth hash: every open page would be signed out."""
    DemoCommand()._ensure_admin()
    before = User.objects.get(username="admin").get_session_auth_hash()
    DemoCommand()._ensure_admin()
    assert User.objects.get(username="admin").get_session_auth_hash() == before


def test_demo_password_applies_only_to_a_new_admin(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_PASSWORD", "from-the-environment-1")
    _, hint = DemoCommand()._ensure_admin()
    assert User.objects.get(username="admin").check_password("from-the-environment-1")
    assert "from-the-environment-1" in hint


def _prepare(gpus: int = 24) -> dict[str, str]:
    fleet = build_fleet(DEFAULT_SITES, gpu_limit=gpus, seed=DEFAULT_SEED)
    return SimulateCommand()._prepare_inventory(fleet, seed=DEFAULT_SEED)


def test_a_restarted_simulator_reuses_its_tokens(data_dir: Path) -> None:
    first = _prepare()
    count = AgentToken.objects.count()

    second = _prepare()
    third = _prepare()

    assert second == first == third
    assert AgentToken.objects.count() == count, "each start added tokens"
    assert all(AgentToken.authenticate(plain) is not None for plain in third.values())


def test_a_simulator_token_revoked_by_an_admin_is_replaced_not_reused(data_dir: Path) -> None:
    first = _prepare()
    site, plain = next(iter(first.items()))
    revoked = AgentToken.authenticate(plain)
    assert revoked is not None
    AgentToken.objects.filter(pk=revoked.pk).update(revoked_at="2026-01-01T00:00:00Z")

    second = _prepare()

    assert second[site] != plain
    token = AgentToken.objects.get(key_id=second[site].split("_")[1])
    assert token.is_active and token.site.name == site
    others = {s: p for s, p in second.items() if s != site}
    assert others == {s: p for s, p in first.items() if s != site}
    # Exactly one active simulator token per site, whatever happened before.
    for name in second:
        assert AgentToken.objects.active().filter(site__name=name, name__startswith="simulator-").count() == 1


def test_restarts_of_the_demo_keep_one_lineage_row_per_dataset(data_dir: Path) -> None:
    """Issue 21 (item 20): each start seeds the compliance records; a restart adds no lineage row,
    and the first start's row without a job (none was registered yet) names the job later."""
    from django.utils import timezone

    from compliance.demo import MODEL, seed_compliance
    from compliance.models import Lineage
    from fleet.models import Job, Site

    today = timezone.localdate()
    seed_compliance(today=today)
    rows = Lineage.objects.filter(model__name=MODEL[0])
    first = sorted(rows.values_list("dataset__name", "job_id"))
    assert len(first) == 6 and all(job is None for _, job in first)
    site = Site.objects.create(name="ams-1", region="eu-west")
    job = Job.objects.create(site=site, name="llama-70b-pretrain-01", team="foundation", gang_size=24, scheduler_id="a")
    for _ in range(3):
        seed_compliance(today=today)
    after = dict(rows.values_list("dataset__name", "job_id"))
    assert rows.count() == 6, "a restart added lineage rows"
    assert after["demo-web-crawl-2026"] == job.pk
    Job.objects.create(site=site, name="another", team="code", gang_size=8, scheduler_id="b")
    seed_compliance(today=today)
    assert rows.count() == 6 and dict(rows.values_list("dataset__name", "job_id")) == after
