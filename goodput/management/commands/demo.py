from __future__ import annotations

import contextlib
import io
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser, OutputWrapper
from django.db import connections
from django.utils import timezone

from console.roles import ADMIN

if TYPE_CHECKING:
    import uvicorn


def server_config(host: str, port: int) -> uvicorn.Config:
    """The demo's uvicorn server, as the production command in docs/production.md runs it.

    On SIGTERM or Ctrl-C uvicorn waits for open connections (a dashboard's websocket, a slow
    upload) and their tasks; after SHUTDOWN_GRACE_SECONDS it cancels what is left and exits.
    """
    import uvicorn

    return uvicorn.Config(
        "goodput.asgi:application",
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        ws_ping_interval=20,
        proxy_headers=False,  # the app applies forwarded headers, from trusted proxies only (goodput.asgi)
        timeout_graceful_shutdown=getattr(settings, "SHUTDOWN_GRACE_SECONDS", 10),
    )


def ready_server(config: uvicorn.Config, *, on_ready: Callable[[], None]) -> uvicorn.Server:
    """A uvicorn server that calls ``on_ready`` once it listens (never when the port is taken:
    uvicorn exits first, and no sign-in line promises a console that is not there)."""
    import uvicorn

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                on_ready()

    return ReadyServer(config)


class StartupProgress:
    """Start-up on one line, `Starting Goodput… migrations, simulated fleet, a week of history
    (first start) ........ done in 58 s`; at -v 2 a line for each step and each history step."""

    def __init__(self, stdout: OutputWrapper, *, verbose: bool) -> None:
        self.stdout, self.verbose = stdout, verbose
        self.started = time.monotonic()
        self.steps = 0
        self.in_history = False
        if not verbose:
            self._add("Starting Goodput…")

    def _add(self, text: str) -> None:
        self.stdout.write(text, ending="")
        self.stdout.flush()

    def step(self, label: str) -> None:
        if self.verbose:
            self.stdout.write(f"Starting: {label}")
        else:
            self._add(("," if self.steps else "") + f" {label}")
        self.steps += 1

    def history(self, message: str) -> None:
        """The week's history: its first message names it, each later one is a step of it."""
        if self.verbose:
            self.stdout.write(message)
        elif not self.in_history:
            self._add(", a week of history (first start) ")
        else:
            self._add(".")
        self.in_history = True

    def done(self) -> None:
        elapsed = time.monotonic() - self.started
        self.stdout.write(f"Start-up done in {elapsed:.0f} s" if self.verbose else f" done in {elapsed:.0f} s")


class Command(BaseCommand):
    help = (
        "Run the console with a simulated fleet: migrate, create an admin, write a week of history on the "
        "first start, start the simulator and the server."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--gpus", type=int, default=None, help="Limit the simulated fleet (default 384 GPUs)")
        parser.add_argument("--interval", type=float, default=5.0, help="Seconds between simulated samples")
        parser.add_argument(
            "--jobs", type=int, default=8, help="Simulated training jobs (default 8; 0 turns training off)"
        )
        parser.add_argument("--no-simulator", action="store_true", help="Serve the console without the simulator")
        parser.add_argument(
            "--no-history",
            dest="history",
            action="store_false",
            help="Start without the week of history the first start otherwise writes",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # INFO log lines (a partition created, an audit head kept) would scroll the sign-in line
        # away: the demo shows them only when LOG_LEVEL asks for them.
        if "LOG_LEVEL" not in os.environ:
            logging.disable(logging.INFO)
        try:
            self._run(options)
        finally:
            logging.disable(logging.NOTSET)

    def _run(self, options: dict[str, Any]) -> None:
        """1. migrate and make the admin; 2. prepare the simulators and, on a first start, the
        week of history; 3. start the beat and the simulator; 4. serve, and once the server
        listens, print the sign-in line: the last line of start-up, so nothing scrolls it away.
        At -v 2 each step, seed and simulated fault is printed too."""
        verbose = options["verbosity"] >= 2
        # Seeds, released jobs and the simulator's faults: on the pages already, on the terminal at -v 2.
        details = self.stdout if verbose else OutputWrapper(io.StringIO())
        progress = StartupProgress(self.stdout, verbose=verbose)
        progress.step("migrations")
        call_command("migrate", interactive=False, verbosity=0)
        _, sign_in_as = self._ensure_admin()
        url = f"http://{options['host']}:{options['port']}"

        stop = threading.Event()
        session = None
        if not options["no_simulator"]:
            # Before the embedded beat's first detector run: the last session's simulated jobs died
            # with it, and would each raise a hang and an overdue checkpoint until re-registered.
            from fleet.training.simulator import release_simulated_jobs

            release_simulated_jobs(run=f"demo-{int(time.time()):x}", log=details.write)
            # Before the server answers: the inventory, the simulators and, on the first start, the
            # week of history, so the first page opened shows it.
            progress.step("simulated fleet")
            session = self._prepare_simulator(url, options, stop, details, progress.history)
            # A model, its datasets, records of processing, requests and holds for the compliance
            # pages (after the history: its lineage names a training job).
            from compliance.demo import seed_compliance

            added = seed_compliance(today=timezone.localdate())
            if any(added.values()):
                details.write("  compliance: added " + ", ".join(f"{n} {kind}" for kind, n in added.items() if n))
            connections.close_all()
        progress.done()

        if settings.EAGER_TASKS:
            from console.scheduler import EmbeddedBeat

            EmbeddedBeat(stop).start()  # rollups, scrapes and retention without `celery beat`
        simulator = None
        if not options["no_simulator"]:
            simulator = threading.Thread(
                target=self._run_simulator,
                args=(url, options, stop, session, details),
                name="simulator",
                daemon=True,
            )
            simulator.start()

        def ready() -> None:
            self.stdout.write("Ctrl-C stops the server, the simulator and the embedded database.")
            self.stdout.write(self.style.SUCCESS(f"Goodput is ready: sign in at {url}/accounts/login/ {sign_in_as}"))
            self.stdout.flush()

        try:
            # uvicorn re-raises the Ctrl-C it handled; the shutdown below is the clean path.
            with contextlib.suppress(KeyboardInterrupt):
                ready_server(server_config(options["host"], options["port"]), on_ready=ready).run()
        finally:
            stop.set()
            if simulator is not None:
                simulator.join(timeout=10)
            self.stdout.write("Stopped. The data stays under var/; `make demo` again picks it up.")

    def _ensure_admin(self) -> tuple[str, str]:
        """The demo admin, and a line saying how to sign in as it.

        A new admin gets DEMO_PASSWORD if set, else a generated password kept under var/. An
        existing admin keeps its password: setting it again on every start would rotate the
        session hash and sign out every open page (django.contrib.auth ties sessions to it).
        """
        from console.env import env

        User = get_user_model()
        username = "admin"
        password_file = settings.DATA_DIR / "demo_admin_password"
        user = User.objects.filter(username=username).first()
        if user is None:
            password = env("DEMO_PASSWORD")
            if not password:
                password = password_file.read_text().strip() if password_file.exists() else secrets.token_urlsafe(12)
                password_file.write_text(password)
                password_file.chmod(0o600)
            user = User.objects.create_user(username=username, email="admin@localhost", password=password)
            hint = f"as {username} / {password}"
        else:
            saved = password_file.read_text().strip() if password_file.exists() else ""
            if saved and user.check_password(saved):
                hint = f"as {username} / {saved}"
            else:
                hint = (
                    f"as {username} with the password you set (forgotten? "
                    f"`.venv/bin/python manage.py changepassword {username}`)"
                )
        if not (user.is_staff and user.is_superuser):
            user.is_staff = user.is_superuser = True
            user.save(update_fields=["is_staff", "is_superuser"])
        user.groups.add(Group.objects.get(name=ADMIN))
        return username, hint

    def _simulate_options(self, url: str, options: dict[str, Any]) -> dict[str, Any]:
        return {"url": url, "gpus": options["gpus"], "interval": options["interval"], "jobs": options["jobs"]}

    def _prepare_simulator(
        self,
        url: str,
        options: dict[str, Any],
        stop: threading.Event,
        details: OutputWrapper,
        progress: Callable[[str], None],
    ) -> Any:
        """The simulate command's session, prepared in this thread: its options as `simulate` would
        parse them, with the week of history on a first start."""
        from fleet.management.commands.simulate import Command as Simulate

        simulate = Simulate(stdout=details, stderr=self.stderr)
        parser = simulate.create_parser("manage.py", "simulate")
        defaults = vars(parser.parse_args([]))
        prepared = {**defaults, **self._simulate_options(url, options), "history": options["history"]}
        return simulate.prepare(prepared, stop_event=stop, progress=progress)

    def _run_simulator(
        self, url: str, options: dict[str, Any], stop: threading.Event, session: Any, details: OutputWrapper
    ) -> None:
        try:
            call_command(
                "simulate",
                **self._simulate_options(url, options),
                quiet=True,
                stop_event=stop,
                session=session,
                stdout=details,
                stderr=self.stderr,
            )
        except Exception as exc:  # the console keeps serving; say why the simulator stopped
            self.stderr.write(f"simulator stopped: {exc}")
        finally:
            connections.close_all()
