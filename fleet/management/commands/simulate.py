from __future__ import annotations

import hmac
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import requests
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import ProgrammingError, close_old_connections, transaction

from console.models import AgentToken, hash_secret
from fleet.capacity.simulator import seed_capacity
from fleet.choices import Interconnect
from fleet.models import Node, Rack, Site
from fleet.scheduler.simulator import KueueSimulator, seed_queues
from fleet.serving.simulator import ServingSimulator, push_history, serving_for_command
from fleet.telemetry.node_simulator import FLAP_LEAD, SCRIPTED_FLAP_PORT, NodeExporterSimulator
from fleet.telemetry.simulator import (
    DEFAULT_SEED,
    DEFAULT_SITES,
    HOT_RACK_BUDGET_KW,
    HOT_RACK_NAME,
    HOT_RACK_SITE,
    FleetSimulator,
    Poster,
    build_fleet,
    utcnow,
)
from fleet.training.simulator import (
    HANG_AT,
    STALL_FROM,
    STALL_UNTIL,
    TrainingSimulator,
    release_simulated_jobs,
)

TOKEN_PREFIX = "simulator"
NODES_PER_RACK = 4
# The datasets RAID under the scripted stall slows this long before the jobs stall.
SLOW_BEFORE_STALL = timedelta(seconds=30)


@dataclass
class Session:
    """A prepared simulation: the inventory and tokens in place, the simulators made and, on a
    first start with ``--history``, the week before now written. ``manage.py demo`` prepares one
    before its server starts (so the first page shows the history) and hands it to the command."""

    options: dict[str, Any]
    fleet: dict[str, list[Any]]
    sim: FleetSimulator
    poster: Poster
    run: str
    training: TrainingSimulator | None
    serving: ServingSimulator | None
    nodes: NodeExporterSimulator | None = None
    queues: KueueSimulator | None = None  # Kueue on each site's cluster, queueing for the capacity pools
    history: dict[str, int] = field(default_factory=dict)  # what the backfill wrote (empty: none)


class Command(BaseCommand):
    help = (
        "Run a simulated GPU fleet (H100, H200, A100, L40S across three sites) that posts telemetry "
        "to the console's ingest API with agent tokens, exactly as real agents do."
    )
    # `manage.py demo` prepares the session before its server starts, then runs the simulator in a
    # thread and stops it.
    stealth_options = ("stop_event", "session")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="The console's base URL")
        parser.add_argument("--interval", type=float, default=5.0, help="Seconds between samples (default 5)")
        parser.add_argument("--gpus", type=int, default=None, help="Limit the fleet to this many GPUs (default 384)")
        parser.add_argument(
            "--fault-rate",
            type=float,
            default=0.05,
            help="Faults per GPU-hour (XID 79, double-bit ECC, thermal throttling); default 0.05",
        )
        parser.add_argument(
            "--jobs",
            type=int,
            default=8,
            help="Training jobs on the training nodes, with a scripted hang, data-loader stall, straggler "
            "and preemption (default 8; 0 turns training off)",
        )
        parser.add_argument(
            "--job-failure-rate",
            type=float,
            default=0.01,
            help="Training job failures per GPU-hour of a job's gang (default 0.01)",
        )
        parser.add_argument(
            "--endpoints",
            type=int,
            default=4,
            help="Inference endpoints (vLLM, Triton) pushing Prometheus scrapes every 15 s, with a scripted queueing "
            "collapse, KV exhaustion and quality drop (default 4; 0 turns serving off)",
        )
        parser.add_argument(
            "--serving-history",
            type=float,
            default=3.0,
            help="Hours of serving history pushed at start when no --history was written (default 3)",
        )
        parser.add_argument(
            "--history",
            action="store_true",
            help="On a database with no history yet, first write the week before now in-process (telemetry "
            "rollups, training jobs, serving traffic, resolved incidents): what `manage.py demo` does",
        )
        parser.add_argument("--duration", type=float, default=None, help="Stop after this many seconds")
        parser.add_argument("--ticks", type=int, default=None, help="Stop after this many sampling rounds")
        parser.add_argument(
            "--seed",
            type=int,
            default=DEFAULT_SEED,
            help="Seed: the same seed gives the same GPUs; another seed simulates other hosts",
        )
        parser.add_argument("--wait", type=float, default=60, help="Seconds to wait for the console to answer")
        parser.add_argument("--quiet", action="store_true", help="Print faults and errors only")

    def handle(self, *args: Any, **options: Any) -> None:
        self.stop_event: threading.Event = options.get("stop_event") or threading.Event()
        session: Session = options.get("session") or self.prepare(options, stop_event=self.stop_event)
        self._wait_for_console(options["url"], options["wait"])
        sim, poster, training, serving = session.sim, session.poster, session.training, session.serving
        if serving is not None and not session.history and options["serving_history"] > 0:
            push_history(serving, hours=options["serving_history"], now=utcnow())
            close_old_connections()
        total = sum(len(g) for g in session.fleet.values())
        self.stdout.write(
            f"Simulating {total} GPUs on {sum(1 for g in session.fleet.values() if g)} sites every "
            f"{options['interval']:g} s -> {options['url']} (Ctrl-C stops)"
        )
        started, tick = time.monotonic(), 0
        while not self.stop_event.is_set():
            tick_start = time.monotonic()
            self._tick(sim, poster, tick, quiet=options["quiet"])
            if training is not None:
                training.tick(utcnow())
                for rejected in training.rejected:
                    self.stderr.write(f"training events rejected: {rejected}")
                training.rejected.clear()
                if tick == 0 and session.nodes is not None:
                    self._script_node_faults(session.nodes, training)
            if session.nodes is not None:
                session.nodes.tick(utcnow(), poster)
                for rejected in session.nodes.rejected:
                    self.stderr.write(f"node_exporter scrape rejected: {rejected}")
                session.nodes.rejected.clear()
            if session.queues is not None:
                session.queues.tick(utcnow(), poster)
                for rejected in session.queues.rejected:
                    self.stderr.write(f"Kueue scrape rejected: {rejected}")
                session.queues.rejected.clear()
            if serving is not None:
                serving.tick(utcnow())
                for rejected in serving.rejected:
                    self.stderr.write(f"serving scrapes or events rejected: {rejected}")
                serving.rejected.clear()
            tick += 1
            if options["ticks"] is not None and tick >= options["ticks"]:
                break
            if options["duration"] is not None and time.monotonic() - started >= options["duration"]:
                break
            self.stop_event.wait(max(0.0, options["interval"] - (time.monotonic() - tick_start)))

    def prepare(
        self,
        options: dict[str, Any],
        *,
        stop_event: threading.Event,
        progress: Callable[[str], None] | None = None,
    ) -> Session:
        """Everything before the first tick that needs only the database: the inventory and tokens,
        the capacity seed, the previous session's jobs released, the simulators, and with
        ``history`` on a first start the week before now. The console need not be up yet.
        ``progress`` hears the week's history, its start and each step (default: a line each on
        stdout); `make demo` folds them into one line."""
        if options["interval"] <= 0:
            raise CommandError("--interval must be positive")
        if options["jobs"] < 0:
            raise CommandError("--jobs must be 0 or more")
        fleet = build_fleet(DEFAULT_SITES, gpu_limit=options["gpus"], seed=options["seed"])
        try:
            tokens = self._prepare_inventory(fleet, seed=options["seed"])
            # Pools, orders, a grid approval, quotas and reservations, so the capacity plan has a story.
            capacity = seed_capacity(
                [spec for spec in DEFAULT_SITES if fleet.get(spec.name)], seed=options["seed"], now=utcnow()
            )
            if any(capacity.values()):
                self.stdout.write("  capacity: added " + ", ".join(f"{n} {kind}" for kind, n in capacity.items()))
            # Pool prices (fleet.cost), so the cost page has figures on first open.
            from fleet.cost.simulator import seed_prices

            if prices := seed_prices(now=utcnow()):
                self.stdout.write(f"  cost: added {prices} pool prices")
        except ProgrammingError as exc:
            raise CommandError(
                f"The database is not ready ({exc.__class__.__name__}); run `manage.py migrate` first."
            ) from exc
        close_old_connections()
        sim = FleetSimulator(
            fleet, fault_rate_per_gpu_hour=options["fault_rate"], interval=options["interval"], seed=options["seed"]
        )
        poster = Poster(options["url"], tokens, sleep=stop_event.wait)
        # Event ids are unique per run: a restarted simulator continues its jobs with new ones.
        run = f"r{int(time.time()):x}"
        # The previous session's jobs died with its process: release them before this one runs, or
        # each pages for a hang (and, if this session does not place it, forever).
        release_simulated_jobs(run=run, log=lambda message: self.stdout.write(f"  training: {message}"))
        close_old_connections()
        training = None
        if options["jobs"]:
            training = TrainingSimulator(
                sim,
                poster,
                jobs=options["jobs"],
                seed=options["seed"],
                failure_rate_per_gpu_hour=options["job_failure_rate"],
                run=run,
                log=lambda message: self.stdout.write(f"  training: {message}"),
            )
        serving = None
        if options["endpoints"] > 0:
            serving = serving_for_command(
                poster,
                endpoints=options["endpoints"],
                seed=options["seed"],
                run=run,
                log=lambda message: self.stdout.write(f"  serving: {message}"),
            )
        nodes = NodeExporterSimulator(
            fleet, seed=options["seed"], activity=training.node_activity if training is not None else None
        )
        # Kueue's ClusterQueues for the capacity seed's quotas, registered and mapped to their pools
        # and teams before the first scrape (fleet.scheduler.simulator).
        queues = KueueSimulator(fleet, seed=options["seed"])
        seed_queues(queues)
        session = Session(options, fleet, sim, poster, run, training, serving, nodes, queues)
        if options.get("history"):
            from fleet.management.backfill import backfill, history_needed

            if history_needed():
                say = progress or self.stdout.write
                say("Writing a week of history (first start)…")
                site_ids = dict(Site.objects.filter(name__in=tokens).values_list("name", "pk"))
                session.history = backfill(
                    sim,
                    training,
                    serving,
                    site_ids=site_ids,
                    now=utcnow(),
                    nodes=nodes,
                    queues=queues,
                    log=lambda m: say(f"  {m}"),
                )
        close_old_connections()
        return session

    def _script_node_faults(self, nodes: NodeExporterSimulator, training: TrainingSimulator) -> None:
        """The fabric and storage faults under the training scenarios (fleet.training.simulator):
        a compute port of the hang job's first node flaps just before it hangs, and the stall
        jobs' datasets RAID saturates just before their loaders starve."""
        start = training.started_at
        if start is None:
            return
        for job in training.jobs:
            if job.scenario == "hang":
                nodes.flap(job.nodes[0], SCRIPTED_FLAP_PORT, start + HANG_AT - FLAP_LEAD)
            elif job.scenario == "stall":
                nodes.slow(job.nodes, start + STALL_FROM - SLOW_BEFORE_STALL, start + STALL_UNTIL)

    def _tick(self, sim: FleetSimulator, poster: Poster, tick: int, *, quiet: bool) -> None:
        latencies, posted, failed = [], 0, []
        for site, samples in sim.batches(utcnow()).items():
            if not samples:
                continue
            t0 = time.monotonic()
            response = poster.post(site, samples)
            latencies.append((time.monotonic() - t0) * 1000)
            if response is not None and response.status_code == 202:
                posted += len(samples)
            else:
                detail = f"HTTP {response.status_code}: {response.text[:200]}" if response is not None else "gave up"
                failed.append(f"{site} ({detail})")
        for event in sim.events:
            self.stdout.write(f"  fault: {event}")
        sim.events.clear()
        if failed:
            self.stderr.write(f"tick {tick}: batches rejected or undelivered: {'; '.join(failed)}")
        if not quiet and (tick % 12 == 0):
            p50 = statistics.median(latencies) if latencies else 0
            self.stdout.write(f"tick {tick}: posted {posted} samples, median POST {p50:.0f} ms")

    def _prepare_inventory(self, fleet: dict[str, list[Any]], *, seed: int) -> dict[str, str]:
        """Sites, racks and nodes as an operator would have entered them, and one token per site.

        The plain tokens are kept under var/ (mode 600, like the demo's admin password), so a
        restarted simulator reuses them instead of adding a token per site on every start.
        """
        tokens: dict[str, str] = {}
        saved_path = settings.DATA_DIR / f"simulator_tokens_{seed}.json"
        try:
            saved = json.loads(saved_path.read_text()) if saved_path.exists() else {}
        except ValueError:
            saved = {}
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        with transaction.atomic():
            for spec in DEFAULT_SITES:
                if not fleet.get(spec.name):
                    continue
                site, _ = Site.objects.update_or_create(
                    name=spec.name, defaults={"region": spec.region, "contracted_power_kw": spec.contracted_power_kw}
                )
                hostnames = sorted({g.hostname for g in fleet[spec.name]})
                groups = {g.prefix: g for g in spec.groups}
                for i, hostname in enumerate(hostnames):
                    rack_name = f"r{i // NODES_PER_RACK + 1:02d}"
                    rack, _ = Rack.objects.get_or_create(site=site, name=rack_name, defaults={"power_budget_kw": 45})
                    hot = (spec.name, rack_name) == (HOT_RACK_SITE, HOT_RACK_NAME)
                    if hot and rack.power_budget_kw != HOT_RACK_BUDGET_KW:
                        rack.power_budget_kw = HOT_RACK_BUDGET_KW  # the rack that runs hot (fleet.telemetry.simulator)
                        rack.save(update_fields=["power_budget_kw"])
                    group = groups[hostname.rsplit("-", 1)[0].removeprefix(f"s{seed}-")]
                    Node.objects.update_or_create(
                        hostname=hostname,
                        defaults={
                            "site": site,
                            "rack": rack,
                            "instance_type": group.instance_type,
                            "interconnect": Interconnect.INFINIBAND
                            if group.workload == "training"
                            else Interconnect.PCIE,
                        },
                    )
                tokens[spec.name] = self._site_token(site, name=f"{TOKEN_PREFIX}-{seed}", saved=saved.get(spec.name))
            saved_path.write_text(json.dumps({**saved, **tokens}))
            saved_path.chmod(0o600)
        return tokens

    @staticmethod
    def _site_token(site: Site, *, name: str, saved: str | None) -> str:
        """The simulator's saved token for ``site`` if it is still active, else a new one.

        The database decides, not AgentToken.authenticate: its per-process cache could still
        accept a token an admin has just revoked. A new token revokes this simulator's old ones
        (another seed, another simulator, keeps its own).
        """
        parts = (saved or "").split("_", 2)
        if len(parts) == 3:
            token = AgentToken.objects.active().filter(site=site, name=name, key_id=parts[1]).first()
            if token is not None and hmac.compare_digest(token.secret_hash, hash_secret(parts[2])):
                AgentToken.objects.filter(site=site, name=name).exclude(pk=token.pk).revoke()
                return saved
        AgentToken.objects.filter(site=site, name=name).revoke()
        return AgentToken.issue(site=site, name=name)[1]

    def _wait_for_console(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.stop_event.is_set():
            try:
                if requests.get(url.rstrip("/") + "/healthz", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise CommandError(f"The console at {url} did not answer /healthz within {timeout:g} s.")
            self.stop_event.wait(0.5)
