"""Saying plainly, at start-up, how this process runs."""

from __future__ import annotations

import sys

from django.conf import settings


def describe_mode() -> str:
    if settings.EMBEDDED_DATABASE:
        db = f"embedded PostgreSQL (data in {settings.DATA_DIR / 'pgdata'})"
    else:
        db = f"PostgreSQL at {settings.DATABASES['default'].get('HOST') or 'localhost'}"
    if settings.EAGER_TASKS:
        tasks = "Celery tasks run eagerly in this process (no broker); websockets use an in-memory layer"
    else:
        tasks = "Celery tasks go to the Redis broker; websockets use channels-redis"
    return f"Goodput {settings.RUN_MODE} mode: {db}; {tasks}."


def announce_mode(role: str) -> None:
    print(f"[goodput:{role}] {describe_mode()}", file=sys.stderr, flush=True)
