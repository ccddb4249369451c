"""`manage.py check --deploy`: the console's database role (console.dbroles), and outbound
requests with nowhere to go.

Warns when this process has DATABASE_OWNER_URL or DATABASE_ADMIN_URL in its environment (only
migrate and setup_database_roles need them), and when the console connects as a superuser, as the
owner of the audit log (or a member of that owner: a deployment that migrated as the console's own
role), as a role that may UPDATE, DELETE or TRUNCATE an append-only table, or as one that may
CREATE in a schema (where it could plant what the owner's functions run). The role is read from
the database itself; a database the check cannot reach is not judged.
An empty GOODPUT_OUTBOUND_ALLOWED_NETWORKS (the production default) refuses every scrape and
notification, which is safe but rarely meant.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register

from console import dbroles, runtime

logger = logging.getLogger(__name__)

HINT = (
    "Run the console as an application role: `manage.py setup_database_roles` creates it and the owner, "
    "and takes CREATE on the schema from it; migrate with DATABASE_OWNER_URL, run with DATABASE_URL "
    "(docs/production.md)."
)


def connection_problems() -> list[str]:
    """What is wrong with the role DATABASE_URL connects as; empty when fit or unreachable."""
    import psycopg

    from console.backup import libpq_params

    params = libpq_params({**settings.DATABASES["default"], **settings.DATABASE_APP})
    try:
        with psycopg.connect(**{**params, "connect_timeout": "5"}) as conn:  # type: ignore[arg-type]
            return dbroles.connection_role_problems(conn.cursor())
    except psycopg.Error as exc:
        logger.debug("check --deploy: the database role was not checked: %s", exc)
        return []


@register(Tags.security, deploy=True)
def database_roles(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    warnings = []
    if names := runtime.privileged_urls_in_environment():
        warnings.append(
            Warning(
                runtime.privileged_urls_warning(names),
                hint="Give the owner's URL to the migrate step only (docs/production.md).",
                id="goodput.W101",
            )
        )
    warnings += [Warning(problem, hint=HINT, id="goodput.W102") for problem in connection_problems()]
    return warnings


@register(Tags.security, deploy=True)
def outbound_networks_listed(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if settings.OUTBOUND_ALLOWED_NETWORKS:
        return []
    return [
        Warning(
            "GOODPUT_OUTBOUND_ALLOWED_NETWORKS lists no network: scrape targets and notification channels "
            "cannot reach anything.",
            hint="List the exporters' networks and the chat and paging services' (e.g. 10.20.0.0/16,fd00:20::/48; "
            "docs/security.md).",
            id="goodput.W104",
        )
    ]


@register(Tags.database)
def web_threads_within_the_pool(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """A web process runs up to WEB_THREADS requests at once, each holding a pooled connection
    (console.http): more threads than the pool has connections makes the rest wait for one."""
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    size = pool.get("max_size") if isinstance(pool, dict) else None
    if size is not None and size < settings.WEB_THREADS:
        return [
            Warning(
                f"GOODPUT_WEB_THREADS is {settings.WEB_THREADS}, more than the {size} connections of "
                "DATABASE_POOL_MAX: requests past the pool wait up to DATABASE_POOL_TIMEOUT for a connection.",
                hint="Set GOODPUT_WEB_THREADS at or under DATABASE_POOL_MAX.",
                id="goodput.W103",
            )
        ]
    return []
