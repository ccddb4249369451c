"""What each pytest-xdist worker has to itself, so that tests running side by side never meet.

Loaded with ``-p tests.parallel`` (pyproject's addopts) so that it runs before pytest-django reads
the settings: the settings read ``REDIS_URL`` once, at import.

- **Redis**: worker ``gwN`` uses database ``D - N`` of ``REDIS_URL``'s server, where ``D`` is the
  database ``REDIS_URL`` names (``make test``'s default 15: workers use 15, 14, 13, ...). A run of
  ``n`` workers therefore needs databases ``D - n + 1`` to ``D``; it stops at start-up rather than
  share one (the suite flushes its database). A serial run (``-n 0``) uses ``D`` itself.
- **PostgreSQL**: one database per worker, cloned from one migrated template (tests/conftest.py,
  ``django_db_setup``).
- **Ports**: ``free_port`` hands each worker its own band, so two workers cannot both find the same
  port free and race to bind it.
- **Temporary directories**: pytest's ``tmp_path`` is per worker already; the process id names the
  rest (tests/conftest.py, tests/stack.py).
"""

from __future__ import annotations

import itertools
import os
import socket
from urllib.parse import urlsplit, urlunsplit

# Below Linux's ephemeral range (32768 and up), where the kernel picks ports for outgoing
# connections and for bind(0): a port of our band is never taken from under us by a client socket.
PORT_BASE = 20000
PORTS_PER_WORKER = 500


def worker_index() -> int:
    """0 for a serial run and for worker gw0, N for worker gwN."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw"))


def redis_url_for_worker(url: str, index: int) -> str:
    """``url`` with its database lowered by ``index`` (the module docstring's rule)."""
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0)
    if database - index < 0:
        raise SystemExit(
            f"REDIS_URL names database {database}: worker gw{index} would need database {database - index}. "
            "Workers count down from REDIS_URL's database; name a higher one or run fewer workers (-n)."
        )
    return urlunsplit(parts._replace(path=f"/{database - index}"))


_ports = itertools.count()


def free_port() -> int:
    """A loopback port nothing listens on, from this worker's band."""
    first = PORT_BASE + worker_index() * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = first + next(_ports) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # someone else's (another program, or a server a test left in TIME_WAIT)
            return port
    raise RuntimeError(f"no free port in {first}-{first + PORTS_PER_WORKER - 1}")


if "PYTEST_XDIST_WORKER" in os.environ and os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = redis_url_for_worker(os.environ["REDIS_URL"], worker_index())
