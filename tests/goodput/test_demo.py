"""`make demo` restarts: the admin keeps its password and the simulator keeps its tokens; its
start-up output ends with the sign-in line."""

from __future__ import annotations

import io
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import OutputWrapper

from console.models import AgentToken
from console.scheduler import EmbeddedBeat
from fleet.management.commands.simulate import Command as SimulateCommand
from fleet.telemetry.simulator import DEFAULT_SEED, DEFAULT_SITES, build_fleet
from goodput.management.commands import demo
from goodput.management.commands.demo import Command as DemoCommand
from goodput.management.commands.demo import StartupProgress

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_start_up_ends_with_the_sign_in_line_and_no_info_log(
    data_dir: Path, settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 38 (item 6): partition INFO lines scrolled the password away. The start-up's INFO log
    (here the beat's partitions, logged as the real beat does) is not shown, and the sign-in line
    is printed once the server listens, last."""
    monkeypatch.setenv("DEMO_PASSWORD", "demo-pass-38")
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    settings.EAGER_TASKS = True

    def beat_start(self: EmbeddedBeat) -> None:  # no thread to outlive the test
        logging.getLogger("fleet.telemetry.partitions").info("created partitions fleet_gpusample_p20261207")

    async def stop_once_listening(self: uvicorn.Server) -> None:
        self.should_exit = True

    commands: list[str] = []  # the test database is migrated: migrate as the owner cannot run inside its transaction
    monkeypatch.setattr(demo, "call_command", lambda name, **options: commands.append(name))
    monkeypatch.setattr(EmbeddedBeat, "start", beat_start)
    monkeypatch.setattr(uvicorn.Server, "main_loop", stop_once_listening)
    port = _free_port()
    out = io.StringIO()
    caplog.set_level(logging.INFO)  # what the console's log handler would print, INFO included

    call_command("demo", "--no-simulator", "--port", str(port), stdout=out)

    assert commands == ["migrate"]
    lines = out.getvalue().splitlines()
    # What follows the sign-in line is the Ctrl-C's: the server was stopped.
    assert lines[-1].startswith("Stopped.")
    assert lines[-2] == f"Goodput is ready: sign in at http://127.0.0.1:{port}/accounts/login/ as admin / demo-pass-38"
    assert lines[0].startswith("Starting Goodput… migrations")
    assert [r.getMessage() for r in caplog.records if r.levelno <= logging.INFO] == []
    assert logging.getLogger("fleet").isEnabledFor(logging.INFO), "the demo left INFO logging off"


def test_the_weeks_history_is_one_progress_line() -> None:
    out = io.StringIO()
    progress = StartupProgress(OutputWrapper(out), verbose=False)
    progress.step("migrations")
    progress.step("simulated fleet")
    progress.history("Writing a week of history (first start)…")
    for step in ("  history: 8 training jobs, 83551 events (10.6 s)", "  history: a week written (56.4 s)"):
        progress.history(step)
    progress.done()

    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith(" s\n")
    assert text.startswith("Starting Goodput… migrations, simulated fleet, a week of history (first start) .. done in")


def test_each_step_has_its_line_at_verbosity_2() -> None:
    out = io.StringIO()
    progress = StartupProgress(OutputWrapper(out), verbose=True)
    progress.step("migrations")
    progress.history("Writing a week of history (first start)…")
    progress.history("  history: a week written (56.4 s)")
    progress.done()
    assert out.getvalue().splitlines()[:3] == [
        "Starting: migrations",
        "Writing a week of history (first start)…",
        "  history: a week written (56.4 s)",
    ]
