"""`make soak`: the console keeps its promises under faults and load, measured on its own services.

It starts its own PostgreSQL and Redis (``soak_stack``), two web processes, two Celery workers and
beat in production mode, the real ``goodput-agent`` on simulated hosts (a fake pynvml at the NVML
boundary only, ``soak_nvml/``), a pusher of dcgm-exporter text, a vLLM server the console scrapes,
and probes of the dashboard APIs (``soak_sources``). Then, in order:

1. **Faults** (``--rounds``, at least 10, mixed): SIGKILL a worker in the middle of a COPY (a
   lock the soak holds keeps the COPY in flight until the kill), SIGKILL a web process, restart
   Redis, restart PostgreSQL (clean, then a crash), stop the whole console for two minutes while
   the agents spool, fill the agents' spool disk while the console is unreachable, stop a worker
   gracefully. Two XIDs are raised on the simulated GPUs in the middle of faults: each must open
   exactly one incident. Afterwards every sample the agents read and the pusher pushed is looked
   up by its identity (GPU UUID and energy counter for the agents, GPU UUID and timestamp for the
   pushes): ``sent``, ``stored`` once, ``duplicates``; any 5xx other than 503 from any door
   (``http_5xx``); incidents other than the two XIDs' and the console's own health findings
   (``false_incidents``).
2. **Live load and a rolling restart** (``soak_live``): websocket clients and 1,000 GPUs every 10 s.
3. **Memory**: web and worker RSS each minute at fleet load; growth after the warm-up.
4. **Backup**: ``manage.py backup`` of the soak's database and ``manage.py restore`` into an empty
   one; every table's row count and checksum compared.

Each phase prints its ``RESULT`` line; the last line repeats the verdict. ``--short`` is the CI
subset (six rounds, a 20 s console stop, 50 clients, a 3-minute memory run), judged on
correctness only (nothing lost or stored twice, no 5xx, no false incident, every client back, no
snapshot gap, the restore equal): its timings are printed, not asserted, since CI machines differ.
Exit status 0 only if every acceptance figure holds. ``--keep`` keeps the work directory (logs, database) for a look.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
import requests
import soak_sources
from _common import ROOT, log
from soak_stack import WEB_DRAIN_S, WEB_GRACE_S, WORKER_GRACE_S, Stack, bootstrap

AGENT_SITE, PUSH_SITE, SCRAPE_SITE = "soak-agents", "soak-push", "soak-scrape"
LOAD_SITES = ["soak-load-a", "soak-load-b", "soak-load-c"]
NVML_DIR = Path(__file__).resolve().parent / "soak_nvml"
PASSWORD = "soak-password-" + "p" * 12
# Findings the console raises about itself: its own outage is what they exist to report.
CONSOLE_HEALTH = {"detector:ingest-silent"}
DASHBOARD_PATHS = [
    "/api/v1/fleet/overview/?range=1h",
    "/api/v1/incidents/",
    "/api/v1/fleet/sites/",
    "/readyz",
]


@dataclass
class Round:
    name: str
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Expected:
    """A fault the soak causes on purpose, which must open exactly one incident."""

    gpu_uuid: str
    xid: int
    source: str = "detector:critical-xid"


@dataclass
class Soak:
    args: argparse.Namespace
    workdir: Path
    stack: Stack = field(init=False)
    tokens: dict[str, Any] = field(default_factory=dict)
    agents: list[str] = field(default_factory=list)
    expected: list[Expected] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    stop_times: dict[str, float] = field(default_factory=dict)
    results: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    spool_mounted: bool = False
    fault_5xx: int = 0
    live_5xx: int = 0

    def __post_init__(self) -> None:
        self.stack = Stack(self.workdir)
        self.ledger = self.workdir / "nvml-ledger"
        self.control = self.workdir / "nvml-control.json"
        self.spool_root = self.workdir / "spool"

    # --- setup ------------------------------------------------------------------------------

    def start(self) -> None:
        self.stack.start()
        self.tokens = bootstrap(self.stack, [AGENT_SITE, PUSH_SITE, SCRAPE_SITE, *LOAD_SITES], PASSWORD)
        self._mount_spool()
        self.control.write_text(json.dumps({"xid": {}}))
        for index in range(self.args.agents):
            self.start_agent(index)
        self.pusher = soak_sources.Pusher(
            self.stack.web_urls, self.tokens["agents"][PUSH_SITE], hosts=2, gpus_per_host=8, interval=2.0
        )
        self.pusher.start()
        self.target = soak_sources.VllmTarget()
        self.target.start()
        self._register_scrape_target()
        self.probe = soak_sources.ApiProbe(self.stack.web_urls, DASHBOARD_PATHS, self.tokens["personal"])
        self.probe.start()

    def _mount_spool(self) -> None:
        """The agents' spool on a small filesystem of its own, so the soak can fill it without
        filling the machine's (a tmpfs: needs root; otherwise the disk-full round is left out)."""
        self.spool_root.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=8m", "soak-spool", str(self.spool_root)], capture_output=True
            )
            self.spool_mounted = done.returncode == 0
        if not self.spool_mounted:
            log("the spool's disk cannot be filled here (mounting a tmpfs needs root): that round is left out")

    def agent_host(self, index: int) -> str:
        return f"soak-agent-{index:02d}"

    def start_agent(self, index: int) -> None:
        name = f"agent{index}"
        token_file = self.workdir / f"{name}.token"
        token_file.write_text(self.tokens["agents"][AGENT_SITE])
        token_file.chmod(0o600)
        env = dict(os.environ)
        env.update(
            PYTHONPATH=f"{NVML_DIR}{os.pathsep}{ROOT}",
            PYTHONUNBUFFERED="1",
            SOAK_NVML_GPUS="8",
            SOAK_NVML_HOST=self.agent_host(index),
            SOAK_NVML_LEDGER=str(self.ledger),
            SOAK_NVML_CONTROL=str(self.control),
        )
        url = self.stack.web_urls[index % len(self.stack.web_urls)]
        args = [
            sys.executable,
            "-m",
            "clients.agent",
            "--url",
            url,
            "--token-file",
            str(token_file),
            "--interval",
            str(self.args.agent_interval),
            "--hostname",
            self.agent_host(index),
            "--spool-dir",
            str(self.spool_root / name),
        ]
        self.stack.spawn(name, args, env=env)
        if name not in self.agents:
            self.agents.append(name)

    def _register_scrape_target(self) -> None:
        response = requests.post(
            self.stack.web_urls[0] + "/api/v1/fleet/scrape-targets/",
            headers={"Authorization": f"Bearer {self.tokens['personal']}"},
            json={
                "site": SCRAPE_SITE,
                "name": "vllm-soak",
                "url": self.target.url,
                "kind": "vllm",
                "interval_seconds": 5,
            },
            timeout=30,
        )
        if response.status_code >= 300:
            raise RuntimeError(f"registering the scrape target: {response.status_code} {response.text[:500]}")

    # --- faults -----------------------------------------------------------------------------

    def raise_xid(self, gpu_uuid: str, xid: int) -> None:
        control = json.loads(self.control.read_text())
        control["xid"][gpu_uuid] = xid
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(control))
        tmp.replace(self.control)
        self.expected.append(Expected(gpu_uuid, xid))
        log(f"  XID {xid} raised on {gpu_uuid}")

    def agent_gpus(self, index: int) -> list[str]:
        return [soak_sources.gpu_uuid(self.agent_host(index), i) for i in range(8)]

    def kill_worker_mid_copy(self, worker: str) -> str:
        """Hold a SHARE lock on the sample table: the next COPY into it waits in flight. SIGKILL
        the worker whose connection runs it, then let go of the lock."""
        with (
            psycopg.connect(self.stack.database_url) as holder,
            psycopg.connect(self.stack.database_url, autocommit=True) as watcher,
        ):
            holder.execute("LOCK TABLE fleet_gpusample IN SHARE MODE")
            deadline = time.monotonic() + 60
            victim = None
            while time.monotonic() < deadline and victim is None:
                rows = watcher.execute(
                    "SELECT client_port FROM pg_stat_activity WHERE query ILIKE 'COPY fleet_gpusample%%' "
                    "AND wait_event_type = 'Lock'"
                ).fetchall()
                for (port,) in rows:
                    victim = self._worker_on_port(port)
                    if victim:
                        break
                time.sleep(0.05)
            if victim is None:
                holder.rollback()
                self.stack.kill(worker)
                time.sleep(2)
                self.stack.start_worker(int(worker.removeprefix("worker")) - 1)
                return f"no COPY caught within 60 s: {worker} killed anyway"
            self.stack.kill(victim)
            holder.rollback()
        index = int(victim.removeprefix("worker")) - 1
        time.sleep(2)
        self.stack.start_worker(index)
        return f"{victim} killed while its COPY into fleet_gpusample was in flight"

    def _worker_on_port(self, port: int) -> str | None:
        import psutil

        for name in self.stack.worker_names():
            for member in self.stack.tree(name):
                with contextlib.suppress(psutil.Error):
                    if any(c.laddr and c.laddr.port == port for c in member.net_connections(kind="tcp")):
                        return name
        return None

    def kill_web(self, index: int) -> str:
        name = f"web{index + 1}"
        self.stack.kill(name)
        time.sleep(5)
        self.stack.start_web(index)
        return f"{name} SIGKILLed, back after 5 s"

    def stop_console(self, seconds: float) -> str:
        """Every console process stopped with SIGTERM; the agents keep reading and spool. An XID
        raised meanwhile reaches the console from a spool."""
        taken = self.stack.stop_console()
        self._record_stops(taken)
        self.raise_xid(self.agent_gpus(1)[5], 79)
        time.sleep(seconds)
        spooled = sum(len(list((self.spool_root / a).glob("*.json"))) for a in self.agents)
        self.stack.start_console()
        return f"console stopped for {seconds:.0f} s ({spooled} batches in the agents' spools at the end)"

    def fill_spool_disk(self, seconds: float) -> str:
        """Both web processes down and the spool's disk full: the agents hold batches in memory."""
        filler = self.spool_root / "filler"
        with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as f:  # unbuffered: close cannot fail
            while True:
                f.write(b"\0" * 65536)
        for index in range(len(self.stack.web_urls)):
            self.stop_times[f"web{index + 1}"] = self.stack.stop(f"web{index + 1}", grace=WEB_GRACE_S)
        time.sleep(seconds)
        filler.unlink()
        for index in range(len(self.stack.web_urls)):
            self.stack.start_web(index)
        return f"spool disk full while the web processes were down for {seconds:.0f} s"

    def graceful_worker(self, index: int) -> str:
        name = f"worker{index + 1}"
        taken = self.stack.stop(name, grace=WORKER_GRACE_S)
        self._record_stops({name: taken})
        self.stack.start_worker(index)
        return f"{name} stopped with SIGTERM in {taken:.1f} s and started again"

    def _record_stops(self, taken: dict[str, float]) -> None:
        for name, seconds in taken.items():
            self.stop_times[name] = max(self.stop_times.get(name, 0.0), seconds)

    def plan(self) -> list[tuple[str, Any]]:
        stop_s = 20 if self.args.short else 120
        full = [
            ("kill a worker mid-COPY", lambda: self.kill_worker_mid_copy("worker1")),
            ("kill a web process", lambda: self.kill_web(0)),
            ("restart Redis", self._restart_redis),
            ("restart PostgreSQL", lambda: self._restart_postgres("fast")),
            ("stop the console", lambda: self.stop_console(stop_s)),
            ("fill the spool disk", lambda: self.fill_spool_disk(20)),
            ("kill the other worker mid-COPY", lambda: self.kill_worker_mid_copy("worker2")),
            ("kill the other web process", lambda: self.kill_web(1)),
            ("crash PostgreSQL", lambda: self._restart_postgres("immediate")),
            ("restart Redis again", self._restart_redis),
            ("stop a worker gracefully", lambda: self.graceful_worker(0)),
            ("kill a worker mid-COPY again", lambda: self.kill_worker_mid_copy("worker1")),
        ]
        if not self.spool_mounted:
            full = [r for r in full if r[0] != "fill the spool disk"]
        return full[: self.args.rounds] if self.args.rounds else full

    def _restart_redis(self) -> str:
        self.stack.restart_redis()
        return "redis-server stopped and started again (its append-only file kept the queues)"

    def _restart_postgres(self, mode: str) -> str:
        self.stack.restart_postgres(mode)
        return f"PostgreSQL stopped ({mode}) and started again"

    def run_faults(self) -> None:
        plan = self.plan()
        log(f"warming up for {self.args.warmup} s")
        self.settle(self.args.warmup)
        for number, (name, action) in enumerate(plan, 1):
            if name == "kill a web process":  # an XID that reaches the console while a web process is down
                self.raise_xid(self.agent_gpus(0)[3], 48)
            log(f"round {number}/{len(plan)}: {name}")
            started = time.monotonic()
            detail = action()
            self.rounds.append(Round(name, time.monotonic() - started, detail))
            log(f"  {detail}")
            self.settle(self.args.settle)

    def settle(self, seconds: float) -> None:
        """Both web processes answering /readyz, then ``seconds`` of normal running, with any
        service that exited on its own started again (as its supervisor would)."""
        deadline = time.monotonic() + 120
        for url in self.stack.web_urls:
            while time.monotonic() < deadline:
                self.stack.supervise()
                with contextlib.suppress(requests.RequestException):
                    if requests.get(url + "/readyz", timeout=5).status_code == 200:
                        break
                time.sleep(1)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.stack.supervise()
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))

    # --- verification -----------------------------------------------------------------------

    def drain(self) -> None:
        """Stop the sources (agents with SIGTERM: the batch in hand is sent or spooled), deliver
        what they still hold, and wait for the console to store it all."""
        log("draining: stopping the sources and waiting for every sample to be stored")
        self.pusher.stop()
        self.stop_agents()
        deadline = time.monotonic() + self.args.drain_timeout
        while time.monotonic() < deadline:  # what a stop left in a spool goes out now
            left = [i for i, name in enumerate(self.agents) if list((self.spool_root / name).glob("*.json"))]
            if not left:
                break
            for index in left:
                self.start_agent(index)
            self.settle(self.args.agent_interval * 3)
            self.stop_agents()
        if not self.pusher.drain(timeout=120):
            self.failures.append("the pusher could not deliver its backlog")
        deadline = time.monotonic() + self.args.drain_timeout
        previous = -1
        while time.monotonic() < deadline:
            sent, stored, _, _ = self.identity_counts()
            if stored == sent:
                return
            if stored != previous:
                log(f"  stored {stored:,} of {sent:,}")
                previous = stored
            self.settle(5)

    def stop_agents(self) -> None:
        """SIGTERM every agent: each finishes its tick and must exit 0 (docs/fleet.md's promise)."""
        for name in self.agents:
            self.stack.stop(name, grace=20)
            code = self.stack.procs[name].returncode
            if code != 0:
                self.failures.append(f"{name} exited with status {code} on SIGTERM, not 0")

    def identity_counts(self) -> tuple[int, int, int, list[str]]:
        """(sent, stored once or more, duplicates, examples of missing samples), by sample identity."""
        produced = soak_sources.read_ledger(self.ledger)
        expected_agent = {(uuid, 1000 * seq) for uuid, top in produced.items() for seq in range(1, top + 1)}
        expected_push = {(uuid, ts) for uuid, stamps in self.pusher.generated.items() for ts in stamps}
        uuids = sorted(produced) + sorted(self.pusher.generated)
        rows = self.stack.sql(
            "SELECT g.uuid, s.energy_mj, (extract(epoch FROM s.ts) * 1000)::bigint, count(*) OVER "
            "(PARTITION BY s.gpu_id, s.ts) FROM fleet_gpusample s JOIN fleet_gpu g ON g.id = s.gpu_id "
            "WHERE g.uuid = ANY(%s)",
            [uuids],
        )
        seen: Counter[tuple[str, int]] = Counter()
        duplicates = 0
        for uuid, energy, ts_ms, same_ts in rows:
            identity = (uuid, int(energy)) if uuid in produced else (uuid, int(ts_ms))
            seen[identity] += 1
            duplicates += same_ts > 1
        duplicates = max(duplicates, sum(n - 1 for n in seen.values()))
        expected = expected_agent | expected_push
        stored = len(expected & set(seen))
        missing = sorted(expected - set(seen))[:5]
        strays = len(set(seen) - expected)
        if strays:
            self.failures.append(f"{strays} stored samples were never sent")
        return len(expected), stored, duplicates, [f"{u} {v}" for u, v in missing]

    def http_5xx(self) -> int:
        bad = self.probe.http_5xx
        bad += sum(
            n
            for status, n in self.pusher.statuses.items()
            if isinstance(status, int) and status >= 500 and status != 503
        )
        for name in self.agents:  # the agent logs every answer it retries
            for line in self.stack.log_text(name).splitlines():
                if "console answered 5" in line and "console answered 503" not in line:
                    bad += 1
        return bad

    def incidents(self) -> tuple[int, list[str]]:
        """(findings that should not exist, what is wrong with the expected incidents).

        Findings, not incidents, are judged: a stray finding about a host joins that host's open
        incident (findings group by host), where an XID's incident would hide it."""
        findings = self.stack.sql("SELECT source, labels->>'gpu', summary, incident_id FROM incidents_finding")
        problems = []
        false = 0
        incidents_of: dict[str, set[int]] = {e.gpu_uuid: set() for e in self.expected}
        for source, gpu, summary, incident_id in findings:
            if any(e.source == source and e.gpu_uuid == gpu for e in self.expected):
                if incident_id is not None:
                    incidents_of[gpu].add(incident_id)
            elif source not in CONSOLE_HEALTH:
                false += 1
                problems.append(f"false finding ({source}): {summary}")
        for e in self.expected:
            if len(incidents_of[e.gpu_uuid]) != 1:
                problems.append(f"XID {e.xid} on {e.gpu_uuid} opened {len(incidents_of[e.gpu_uuid])} incidents, not 1")
        return false, problems

    def verify_faults(self) -> None:
        self.drain()
        sent, stored, duplicates, missing = self.identity_counts()
        http_5xx = self.fault_5xx = self.http_5xx()
        false, problems = self.incidents()
        if missing:
            self.failures.append("missing samples, e.g. " + "; ".join(missing))
        self.failures.extend(problems)
        errors = [e for e in self.probe.errors if e["status"] != 503]
        self.failures.extend(f"5xx: {e}" for e in errors[:5])
        scrapes = self.stack.sql("SELECT count(DISTINCT ts) FROM fleet_servingsample")[0][0]
        log(f"  scrapes served {len(self.target.served)}, stored {scrapes}")
        ok = len(self.rounds) >= (6 if self.args.short else 10) and sent == stored and not duplicates
        ok = ok and not http_5xx and not false and not problems
        if not ok:
            self.failures.append("the fault rounds did not keep every promise")
        self.emit(
            f"RESULT rounds={len(self.rounds)} sent={sent} stored={stored} duplicates={duplicates} "
            f"http_5xx={http_5xx} false_incidents={false} unplanned_restarts={len(self.stack.unplanned)}"
        )
        for line in self.stack.unplanned:
            log(f"  unplanned: {line}")

    def emit(self, line: str) -> None:
        self.results.append(line)
        print(line, flush=True)

    # --- live load, memory, backup ----------------------------------------------------------

    def run_live(self) -> None:
        """Item 2 and the web side of item 5 (``soak_live``): the live load's latency, then a
        rolling restart of the web processes under the same load. soak_live prints their lines."""
        import soak_live

        load_tokens = {site: self.tokens["agents"][site] for site in LOAD_SITES}
        live = soak_live.run_live_load(
            self.stack, load_tokens, password=PASSWORD, clients=self.args.clients, seconds=self.args.live_seconds
        )
        self.results.append(live["result"])
        self.live_5xx = live.get("api_5xx") or 0
        p99 = live.get("p99_ms")
        if p99 is None or live["ws_clients"] < self.args.clients or live.get("api_5xx"):
            self.failures.append("live load: no delivery measured, a client lost or an API 5xx")
        elif p99 > 1000:
            self.timing("live load: delivery p99 over 1,000 ms")
        rolling = soak_live.rolling_restart(self.stack, load_tokens, password=PASSWORD, clients=self.args.clients)
        self.results.append(rolling["result"])
        if not rolling["passed"]:
            self.failures.append("rolling restart: a client was dropped, a snapshot had a gap or a stop ran long")
        if not rolling["within_gap_target"]:
            self.timing(
                f"rolling restart: a client was away {rolling['max_gap_ms']:.0f} ms (target "
                f"{soak_live.GAP_TARGET_MS:.0f} ms)"
            )
        self._record_stops(rolling.get("stop_s", {}))

    def timing(self, problem: str) -> None:
        """A figure past its target. The full soak fails on it; ``--short`` (CI, on whatever machine
        runs it) reports it and judges correctness only: speed is measured, never asserted in CI."""
        if self.args.short:
            log(f"NOTE (not judged in --short): {problem}")
        else:
            self.failures.append(problem)

    def run_memory(self) -> None:
        import soak_live

        minutes = self.args.memory_minutes
        warmup = 1 if minutes <= 5 else 5
        log(f"memory: {minutes} minutes at fleet load, RSS each minute (warm-up {warmup} min)")
        load = soak_live.FleetLoad(self.stack.web_urls, {s: self.tokens["agents"][s] for s in LOAD_SITES})
        load.start()
        samples: dict[str, list[float]] = {name: [] for name in [*self.stack.web_names(), *self.stack.worker_names()]}
        try:
            for minute in range(minutes + 1):
                for name in samples:
                    samples[name].append(self.stack.rss_mib(name))
                if minute % 5 == 0 or minute == minutes:
                    log(f"  minute {minute}: " + ", ".join(f"{n} {v[-1]:.0f} MiB" for n, v in samples.items()))
                if minute < minutes:
                    self.settle(60)
        finally:
            load.stop()
            load.join(timeout=30)
        self.live_5xx += sum(
            n for status, n in load.statuses.items() if isinstance(status, int) and status >= 500 and status != 503
        )

        def growth(names: list[str]) -> float:
            """The worst process: its RSS at the end (the median of the last three minutes, when the
            run is long enough to leave them after the warm-up) against its RSS when the warm-up ended."""
            worst = 0.0
            for name in names:
                series = samples[name]
                after_warmup = series[warmup]
                end = sorted(series[-3:])[1] if len(series) >= warmup + 6 else series[-1]
                if not after_warmup or not end:  # the process was down at a sample: no figure
                    self.failures.append(f"memory: {name} was not running when sampled")
                    continue
                worst = max(worst, 100 * (end - after_warmup) / after_warmup)
            return worst

        web, worker = growth(self.stack.web_names()), growth(self.stack.worker_names())
        self.emit(f"RESULT minutes={minutes} web_rss_growth_pct={web:.1f} worker_rss_growth_pct={worker:.1f}")
        if web > 10 or worker > 10:
            self.timing("memory grew more than 10 % after the warm-up")

    def run_backup(self) -> None:
        """Back up the soak's database, restore it into an empty one, compare every table."""
        [(rows, size)] = self.stack.sql(
            "SELECT (SELECT count(*) FROM fleet_gpusample), coalesce(sum(pg_total_relation_size(inhrelid)), 0) "
            "FROM pg_inherits WHERE inhparent = 'fleet_gpusample'::regclass"
        )
        log(
            f"  raw GPU samples: {rows:,} rows in {size / 2**20:.1f} MiB with indexes "
            f"({size / max(rows, 1):.0f} B a row)"
        )
        out_dir = self.workdir / "backups"
        self.stack.manage("backup", "--output", str(out_dir))
        dump = next(out_dir.glob("*.dump"))
        with psycopg.connect(
            self.stack.database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True, connect_timeout=10
        ) as conn:
            conn.execute('DROP DATABASE IF EXISTS "goodput_restored"')
            conn.execute('CREATE DATABASE "goodput_restored"')
        restored = self.stack.database_url.rsplit("/", 1)[0] + "/goodput_restored"
        out = self.stack.manage("restore", str(dump), "--database-url", restored)
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT")), "")
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        self.emit(
            f"RESULT backup_tables={fields.get('tables')} rows={fields.get('rows')} "
            f"mismatches={fields.get('mismatches')}"
        )
        if fields.get("mismatches") != "0":
            self.failures.append("the restored backup differs from the original")

    def check_5xx(self) -> None:
        """No 5xx other than 503 from any door in any phase: the probes (which ran from the start),
        the pusher, and the live phase's fleet load (soak_live records its statuses)."""
        late = self.http_5xx() - self.fault_5xx
        late += getattr(self, "live_5xx", 0)
        if late:
            self.failures.append(f"{late} answers of 5xx other than 503 after the fault rounds")
        self.results.append(f"RESULT http_5xx_after_faults={late}")
        print(self.results[-1], flush=True)

    def check_stops(self) -> None:
        for name, seconds in sorted(self.stop_times.items()):
            # A web process first drains its websockets (console/drain.py), then has its grace.
            grace = WORKER_GRACE_S if name.startswith("worker") else WEB_DRAIN_S + WEB_GRACE_S
            if seconds > grace + 1:
                self.timing(f"{name} took {seconds:.1f} s to stop, over its {grace} s grace")
        slowest = max(self.stop_times.values(), default=0.0)
        self.emit(f"RESULT graceful_stops={len(self.stop_times)} slowest_stop_s={slowest:.1f}")

    def shutdown(self) -> None:
        for name in self.agents:
            if self.stack.alive(name):
                self.stack.stop(name, grace=20)
        for thread in ("pusher", "probe"):
            with contextlib.suppress(AttributeError):
                getattr(self, thread).stop()
        with contextlib.suppress(AttributeError):
            self.target.stop()
        self.stack.shutdown()
        if self.spool_mounted:
            subprocess.run(["umount", "-l", str(self.spool_root)], capture_output=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="The CI subset: 6 rounds, 50 clients, 3 min of memory")
    parser.add_argument("--rounds", type=int, default=0, help="Fault rounds (default: all 12; --short: 6)")
    parser.add_argument("--agents", type=int, default=4, help="Simulated hosts running goodput-agent (8 GPUs each)")
    parser.add_argument("--agent-interval", type=float, default=2.0, help="Seconds between an agent's samples")
    parser.add_argument("--warmup", type=float, default=30)
    parser.add_argument("--settle", type=float, default=15, help="Seconds of normal running after each round")
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--clients", type=int, default=200, help="Websocket clients in the live load")
    parser.add_argument("--live-seconds", type=int, default=120)
    parser.add_argument("--memory-minutes", type=int, default=30)
    parser.add_argument("--skip", action="append", default=[], choices=["faults", "live", "memory", "backup"])
    parser.add_argument("--workdir", help="Work directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="Keep the work directory (logs, database)")
    args = parser.parse_args(argv)
    if args.short:
        args.rounds = args.rounds or 6
        args.clients = min(args.clients, 50)
        args.live_seconds = min(args.live_seconds, 45)
        args.memory_minutes = min(args.memory_minutes, 3)
        args.warmup = min(args.warmup, 15)
        args.settle = min(args.settle, 8)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="goodput-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    soak = Soak(args, workdir)
    started = time.monotonic()
    try:
        soak.start()
        if "faults" not in args.skip:
            soak.run_faults()
            soak.verify_faults()
        if "live" not in args.skip:
            soak.run_live()
        if "memory" not in args.skip:
            soak.run_memory()
        if "backup" not in args.skip:
            soak.run_backup()
        soak.check_5xx()
        soak.check_stops()
    except Exception as exc:
        soak.failures.append(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        with contextlib.suppress(Exception):
            soak.shutdown()
        for problem in soak.failures:
            log(f"FAILED: {problem}")
        if soak.failures or args.keep:
            log(f"logs and data kept under {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        minutes = (time.monotonic() - started) / 60
        print(f"soak: {'FAILED' if soak.failures else 'passed'} in {minutes:.1f} min", flush=True)
        for line in soak.results:
            print(line, flush=True)
    return 1 if soak.failures else 0


if __name__ == "__main__":
    sys.exit(main())
