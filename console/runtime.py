"""Saying plainly, at start-up, how this process runs."""

from __future__ import annotations

import os
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


# Needed only by `manage.py migrate`, `setup_database_roles` and `flush`: a web or worker process
# holding them could act as the owner (or a superuser) the moment it is compromised.
PRIVILEGED_URLS = ("DATABASE_OWNER_URL", "DATABASE_ADMIN_URL")


def privileged_urls_in_environment() -> list[str]:
    """The owner's and admin's URLs this production process has in its environment (none embedded,
    where the console starts its own server and the URLs are not read)."""
    if settings.EMBEDDED_DATABASE:
        return []
    return [name for name in PRIVILEGED_URLS if os.environ.get(name)]


def privileged_urls_warning(names: list[str]) -> str:
    return (
        f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} set in this process's environment: "
        "only `manage.py migrate` and `setup_database_roles` need them; run web and worker processes "
        "with DATABASE_URL (the app role) alone."
    )


def announce_mode(role: str) -> None:
    print(f"[goodput:{role}] {describe_mode()}", file=sys.stderr, flush=True)
    if names := privileged_urls_in_environment():
        print(f"[goodput:{role}] WARNING: {privileged_urls_warning(names)}", file=sys.stderr, flush=True)


def settle_heap() -> int:
    """Put what start-up built (modules, URL patterns, settings, the app registry) beyond the
    garbage collector's reach, once this process is ready to serve.

    A full collection walks every tracked object. A web process holds some 200,000 from start-up,
    which never die, and walking them took about 75 ms: every eighth or so request of the fabric
    page (which makes enough short-lived containers to trigger one) paid it, tripling its p95, and
    so did every websocket push on the event loop at that moment. Frozen, they are skipped; what
    requests allocate is collected as before. The URL patterns are loaded first (Django reads
    them on the first request otherwise) so every view module is frozen with the rest. Returns
    the objects frozen."""
    import gc

    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (imports every view module now)
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
