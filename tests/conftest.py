"""Shared fixtures: personas, sites with agent tokens, sample batches, and the real process stack.

Most tests run Celery eagerly in the test process with an in-memory channel layer (fast, same
code path). Tests marked ``worker`` or ``browser`` get the production path instead: a real
Celery worker process on Redis, channels-redis, and (for the browser) a real uvicorn server.
"""

from __future__ import annotations

import functools
import itertools
import os
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from channels.layers import channel_layers
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.test import Client

from console import counters, roles
from console.celery import app as celery_app
from console.models import AgentToken, forget_verified_tokens
from fleet.inventory import directory
from fleet.models import Site
from fleet.telemetry import partitions

PASSWORD = "correct-horse-battery-staple"
HEADS_ROOT = Path(tempfile.gettempdir()) / f"goodput-test-heads-{os.getpid()}"
_heads_dirs = itertools.count()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """The test database is created and migrated by the owner role, as `manage.py migrate` does in
    production (console.dbroles; nothing changes where DATABASE_URL's role is the only one)..."""
    from console import dbroles

    dbroles.use(dbroles.owner_credentials())


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest,
    django_test_environment: None,
    django_db_blocker: Any,
    django_db_modify_db_settings: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """...and the tests run as the console's own role, which may not rewrite the audit log; the
    owner drops the database at the end.

    A serial run migrates its database. In a parallel run (pytest-xdist) the first worker migrates
    one template and every worker clones its own database from it (CREATE DATABASE ... TEMPLATE, a
    file copy): the migrations run once, not once per worker."""
    from django.db import connection

    from console import dbroles

    configured_name = settings.DATABASES["default"]["NAME"]
    with django_db_blocker.unblock():
        if worker := os.environ.get("PYTEST_XDIST_WORKER"):
            _clone_worker_database(connection, worker, tmp_path_factory.getbasetemp().parent)
        else:
            connection.creation.create_test_db(
                verbosity=request.config.option.verbose, autoclobber=True, serialize=False
            )
    dbroles.use(dbroles.app_credentials())
    yield
    dbroles.use(dbroles.owner_credentials())
    with django_db_blocker.unblock():
        connection.creation.destroy_test_db(configured_name, verbosity=0)


def _clone_worker_database(connection: Any, worker: str, run_dir: Path) -> None:
    """Make this worker's database (pytest-django named it ``<test name>_gwN``) from the template
    ``<test name>``, which the first worker to take the lock migrates (``run_dir`` is shared by the
    run's workers). The template outlives the run, as a kept database would; the next run's first
    worker makes it anew."""
    import fcntl

    test = connection.settings_dict["TEST"]
    worker_name = test["NAME"]
    template = test["NAME"] = worker_name.removesuffix(f"_{worker}")
    made = run_dir / "template-migrated"
    with open(run_dir / "template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait until the template is whole
        if made.exists():
            connection.settings_dict["NAME"] = template
        else:
            connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
            made.touch()
        connection.creation.clone_test_db(suffix=worker, verbosity=0, autoclobber=True)
    test["NAME"] = connection.settings_dict["NAME"] = settings.DATABASES["default"]["NAME"] = worker_name
    connection.close()


@pytest.fixture(autouse=True)
def _eager_unless_real_stack(request: pytest.FixtureRequest, settings: Any) -> Iterator[None]:
    real = request.node.get_closest_marker("worker") or request.node.get_closest_marker("browser")
    settings.FLEET_SUMMARY_SECONDS = 0  # each test reads what it just wrote (test_fleet_page_cache sets it)
    # Heads kept from one test's chain are not the next one's (made only when a head is written).
    settings.AUDIT_HEADS_DIR = HEADS_ROOT / f"{next(_heads_dirs)}"
    settings.SERVING_SUMMARY_SECONDS = 0
    if not real:
        settings.EAGER_TASKS = True
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
        celery_app.conf.task_always_eager = True
    channel_layers.backends.clear()
    cache.clear()
    directory.clear()  # in-process caches must not outlive a test's rolled-back rows
    counters.reset()
    forget_verified_tokens()
    partitions.forget_known_partitions()
    yield
    celery_app.conf.task_always_eager = settings.CELERY_TASK_ALWAYS_EAGER
    channel_layers.backends.clear()


# --- personas --------------------------------------------------------------------------------


@functools.cache
def _password_hash() -> str:
    """PASSWORD, hashed once per process: PBKDF2's million rounds take about a second, and personas
    are made for most tests. Each persona stores the same real hash, so signing in checks it as
    production does."""
    return make_password(PASSWORD)


def _make_user(username: str, role: str | None, **extra: Any) -> User:
    roles.sync_roles(__import__("django.apps", fromlist=["apps"]).apps)
    user = User.objects.create(username=username, password=_password_hash(), **extra)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def admin_user(db: None) -> User:
    return _make_user("ada", roles.ADMIN, is_staff=True)


@pytest.fixture
def operator_user(db: None) -> User:
    return _make_user("oscar", roles.OPERATOR)


@pytest.fixture
def viewer_user(db: None) -> User:
    return _make_user("vera", roles.VIEWER)


@pytest.fixture
def norole_user(db: None) -> User:
    return _make_user("nora", None)


def _client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_client(admin_user: User) -> Client:  # overrides pytest-django's superuser admin_client
    return _client_for(admin_user)


@pytest.fixture
def operator_client(operator_user: User) -> Client:
    return _client_for(operator_user)


@pytest.fixture
def viewer_client(viewer_user: User) -> Client:
    return _client_for(viewer_user)


@pytest.fixture
def norole_client(norole_user: User) -> Client:
    return _client_for(norole_user)


@pytest.fixture
def anon_client() -> Client:
    return Client()


# --- sites, tokens, batches ------------------------------------------------------------------


@pytest.fixture
def site_a(db: None) -> Site:
    return Site.objects.create(name="ams-1", region="eu-west", contracted_power_kw=500)


@pytest.fixture
def site_b(db: None) -> Site:
    return Site.objects.create(name="iad-2", region="us-east", contracted_power_kw=400)


@pytest.fixture
def token_a(site_a: Site) -> str:
    return AgentToken.issue(site=site_a, name="agent-a")[1]


@pytest.fixture
def token_b(site_b: Site) -> str:
    return AgentToken.issue(site=site_b, name="agent-b")[1]


_counter = itertools.count()


def make_sample(**overrides: Any) -> dict[str, Any]:
    """One valid sample in the agent's JSON format; overrides replace fields."""
    n = next(_counter)
    sample: dict[str, Any] = {
        "gpu_uuid": f"GPU-{uuid.uuid4()}",
        "hostname": "gpu-a-001",
        "gpu_index": n % 8,
        "model": "NVIDIA H100 80GB HBM3",
        "ts": datetime.now(UTC).isoformat(),
        "gpu_util": 97.0,
        "fb_used_mib": 71234,
        "fb_free_mib": 10245,
        "gpu_temp_c": 61.0,
        "memory_temp_c": 70.0,
        "power_w": 612.3,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "energy_mj": 918273645512,
        "xid": 0,
        "ecc_sbe_total": 0,
        "ecc_dbe_total": 0,
        "throttle_reasons": 0,
        "tensor_active": 0.41,
    }
    sample.update(overrides)
    return sample


def post_batch(client: Client, token: str | None, body: Any, **headers: str) -> Any:
    import json

    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    if token:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post("/api/v1/ingest/gpu-samples", data=data, content_type="application/json", **extra)


def redis_url() -> str:
    url = settings.REDIS_URL
    if not url:
        pytest.fail("REDIS_URL must be set: these tests use the real Redis (make test sets it).")
    return url


def _forget_queued_work(client: Any) -> None:
    from fleet.ingest import push_queue
    from fleet.ingest import stream as ingest_stream

    client.delete("celery")
    for lane in (ingest_stream.GPU, push_queue.PROMETHEUS):
        client.delete(lane.stream, lane.dead_letters, lane.reclaim_check, *lane.slot_keys())


@pytest.fixture
def broker_mode(settings: Any) -> Iterator[Any]:
    """The test process queues work in the real Redis broker (no worker consumes it): the ingest
    stream and Celery messages; returns a Redis client on it."""
    import redis

    from console import queues

    settings.EAGER_TASKS = False
    celery_app.conf.task_always_eager = False
    queues.reset()
    client = redis.Redis.from_url(redis_url())
    _forget_queued_work(client)
    yield client
    _forget_queued_work(client)
    queues.reset()
