"""Settings for gpusched, read from the environment with safe defaults.

DATABASE_URL unset means the embedded PostgreSQL under ./var/ (see
gpusched/embedded_db.py); any PostgreSQL server works through DATABASE_URL.
"""

import logging
import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from gpusched.paths import var_dir
from gpusched.upstreams import (
    CONFIG_VARIABLE,
    DEFAULT_UPSTREAM,
    ApiKeysInvalid,
    ConfigPathsInvalid,
    UpstreamListInvalid,
    api_keys_from_environment,
    default_gpu_name,
    dispatch_cluster_name,
    parse_config_paths,
    parse_upstreams,
)

BASE_DIR = Path(__file__).resolve().parent.parent
# What gpusched writes (its secret key in the demo, static files, media,
# the embedded database): ./var/ in a checkout; a service installed from a
# wheel sets GPUSCHED_VAR_DIR (e.g. /var/lib/gpusched).
VAR_DIR = var_dir()


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# Production mode (GPUSCHED_PRODUCTION=1): behind a TLS reverse proxy, with
# its secret key and host names given, and `manage.py check --deploy`
# clean. Without it, the demo `make run` starts with no settings at all.
PRODUCTION = os.environ.get("GPUSCHED_PRODUCTION", "") == "1"
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if PRODUCTION:
    if DEBUG:
        raise ImproperlyConfigured("GPUSCHED_PRODUCTION=1 with DJANGO_DEBUG=1: unset DJANGO_DEBUG")
    if len(SECRET_KEY) < 50:
        raise ImproperlyConfigured(
            "GPUSCHED_PRODUCTION=1 needs DJANGO_SECRET_KEY, at least 50 random characters: "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"
        )
    if not os.environ.get("ALLOWED_HOSTS", "").strip():
        raise ImproperlyConfigured(
            "GPUSCHED_PRODUCTION=1 needs ALLOWED_HOSTS: the host names the site answers to, "
            "comma-separated (e.g. gpusched.example.com)"
        )
elif not SECRET_KEY:
    # A stable per-checkout key, created once under ./var/, so sessions and
    # signed values survive restarts without a secret in the repository.
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        import secrets

        _key_file.parent.mkdir(parents=True, exist_ok=True)
        _key_file.write_text(secrets.token_urlsafe(50))
    SECRET_KEY = _key_file.read_text().strip()

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
if PRODUCTION:
    # The proxy terminates TLS and says so in X-Forwarded-Proto (deploy/nginx);
    # plain HTTP is redirected, but for the local probes of health and metrics.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^api/health/$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(env_float("GPUSCHED_HSTS_SECONDS", 31_536_000))
    # HSTS for every subdomain, and the browsers' preload list, bind the whole
    # domain, not this site: the operator opts in (GPUSCHED_HSTS_SUBDOMAINS=1);
    # until then the two checks that ask for them are the domain's to answer.
    SECURE_HSTS_INCLUDE_SUBDOMAINS = os.environ.get("GPUSCHED_HSTS_SUBDOMAINS", "") == "1"
    SECURE_HSTS_PRELOAD = SECURE_HSTS_INCLUDE_SUBDOMAINS
    if not SECURE_HSTS_INCLUDE_SUBDOMAINS:
        SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021"]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_q",
    "channels",
    "queueapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "queueapp.middleware.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "gpusched.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "gpusched.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],  # the pages' templates are queueapp's (queueapp/templates/)
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
if os.environ.get("DATABASE_URL"):
    DATABASE_URL = os.environ["DATABASE_URL"]
else:
    from gpusched import embedded_db

    DATABASE_URL = embedded_db.ensure_running()
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=int(env_float("GPUSCHED_CONN_MAX_AGE", 60))
    )
}
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Under ASGI (Daphne) every request runs in a thread of its own, so a
# persistent connection per thread is a new connection per request, closed
# only when the thread is collected. GPUSCHED_DB_POOL=N keeps up to N
# connections in a pool instead (psycopg_pool), shared by those threads.
_DB_POOL_SIZE = int(env_float("GPUSCHED_DB_POOL", 0))
if _DB_POOL_SIZE > 0:
    # With CONN_HEALTH_CHECKS Django has the pool test each connection as it
    # hands it out, so after a PostgreSQL restart no request gets a dead one.
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": _DB_POOL_SIZE,
        # A request waits this long for a free connection, or for PostgreSQL
        # to come back, before it is answered 503.
        "timeout": 5,
    }
# Two test runs on one server need two test databases (default: test_<name>).
if os.environ.get("GPUSCHED_TEST_DATABASE"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ["GPUSCHED_TEST_DATABASE"]}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns when it is missing
MEDIA_ROOT = Path(os.environ.get("GPUSCHED_MEDIA_ROOT", VAR_DIR / "media"))
MEDIA_URL = "media/"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True  # serve admin assets without a collectstatic step

# --- API --------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["queueapp.api.auth.MemberTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["queueapp.api.json_io.JsonRenderer"],
    "DEFAULT_PARSER_CLASSES": ["queueapp.api.json_io.JsonParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "queueapp.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpusched API",
    "DESCRIPTION": "Fair, explainable dispatch of GPU jobs to llama-swap.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "queueapp.models.JobStatus",
        "HealthStatusEnum": ["ok", "degraded", "down"],
        # Two fields named `basis`: what a run's estimate rests on, and an ETA's.
        "ExpectedBasisEnum": ["size", "model", "operator", "unknown"],
        "EstimateBasisEnum": ["learned", "guess"],
    },
}

# --- Channels -----------------------------------------------------------------
# Without Redis, changes cross processes through PostgreSQL LISTEN/NOTIFY
# (queueapp/live/) and the layer only fans out inside the ASGI process.
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": "gpusched"},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# The cache holds the failed-login counters (queueapp/logins.py): per process in
# memory, or shared by every web process through Redis.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "gpusched",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- gpusched -----------------------------------------------------------------
# One llama-swap upstream per GPU: `NAME=URL` entries, comma-separated, or
# bare URLs (gpusched/upstreams.py). A dispatcher drives the one named by
# GPUSCHED_GPU (the first when unset); web servers use them all.
LLAMA_SWAP_URL = os.environ.get("LLAMA_SWAP_URL", "").strip() or DEFAULT_UPSTREAM
try:
    GPUSCHED_UPSTREAMS = parse_upstreams(LLAMA_SWAP_URL)
except UpstreamListInvalid as exc:
    raise ImproperlyConfigured(str(exc)) from None
GPUSCHED_GPU = os.environ.get("GPUSCHED_GPU", "").strip() or GPUSCHED_UPSTREAMS[0].name
# gpusched's key for each GPU's llama-swap (its `apiKeys`): LLAMA_SWAP_API_KEY,
# or the file LLAMA_SWAP_API_KEY_FILE names; one key for every GPU or
# `NAME=KEY` entries (gpusched/upstreams.py). Without LLAMA_SWAP_URL the GPUs
# are `make run`'s SIMULATED_GPUS simulators, gpu0, gpu1, ...
_SIMULATED = os.environ.get("SIMULATED_GPUS", "").strip()
_GPU_NAMES = (
    [upstream.name for upstream in GPUSCHED_UPSTREAMS]
    if os.environ.get("LLAMA_SWAP_URL", "").strip()
    else [default_gpu_name(n) for n in range(int(_SIMULATED) if _SIMULATED.isdigit() else 1)]
)
try:
    LLAMA_SWAP_API_KEYS = api_keys_from_environment(os.environ, gpu_names=_GPU_NAMES)
except ApiKeysInvalid as exc:
    raise ImproperlyConfigured(str(exc)) from None
# llama-swap's own config file, read for its routing (which models it keeps
# resident together): one path for every GPU or `NAME=PATH` entries
# (gpusched/upstreams.py); unset, llama-swap's default, one model at a time.
try:
    LLAMA_SWAP_CONFIGS = parse_config_paths(
        os.environ.get(CONFIG_VARIABLE, ""), gpu_names=_GPU_NAMES
    )
except ConfigPathsInvalid as exc:
    raise ImproperlyConfigured(str(exc)) from None
# Failed token logins per client address and minute before every attempt
# from that address is refused (429) for a minute; 0 turns the limit off.
GPUSCHED_AUTH_FAILURES_PER_MINUTE = int(env_float("GPUSCHED_AUTH_FAILURES_PER_MINUTE", 20))
# Front-door calls one web process holds at once (queued or relaying); past
# it a call is refused with 429 and Retry-After, and nothing is queued.
GPUSCHED_FRONT_DOOR_MAX_WAITING = int(env_float("GPUSCHED_FRONT_DOOR_MAX_WAITING", 2000))
# A streaming front-door call that waits in the queue gets an SSE comment
# line (position, estimated start, what runs now) at once and then at least
# this often, in seconds, until its job starts (queueapp/frontdoor/waiting.py).
GPUSCHED_STREAM_COMMENT_SECONDS = env_float("GPUSCHED_STREAM_COMMENT_SECONDS", 5)
# Request body limits in bytes (queueapp/job_body.py; docs/limits.md has
# them all). A REST job's body is stored in the jobs table and read back by
# the dispatcher: 1 MiB. A front-door body stays in the waiting call's memory
# and goes to llama-swap as it came: room for base64 images (JSON paths) and
# OpenAI's 25 MB audio files with their form (multipart paths).
GPUSCHED_MAX_BODY_BYTES = int(env_float("GPUSCHED_MAX_BODY_BYTES", 1024 * 1024))
GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES = int(
    env_float("GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES", 32 * 1024 * 1024)
)
GPUSCHED_FRONT_DOOR_MAX_UPLOAD_BYTES = int(
    env_float("GPUSCHED_FRONT_DOOR_MAX_UPLOAD_BYTES", 32 * 1024 * 1024)
)
# Results larger than this go to file storage instead of the jobs table.
GPUSCHED_RESULT_INLINE_BYTES = int(env_float("GPUSCHED_RESULT_INLINE_BYTES", 256 * 1024))
# The front door's admission and end commit without waiting for the WAL
# flush (queueapp/prepared.py `commit_without_flush_wait`); 0 turns it off.
GPUSCHED_FRONTDOOR_ASYNC_COMMIT = env_float("GPUSCHED_FRONTDOOR_ASYNC_COMMIT", 1) != 0
# How long one upstream call may take before the job fails (a 16-minute render
# plus room for a model swap).
GPUSCHED_JOB_TIMEOUT = env_float("GPUSCHED_JOB_TIMEOUT", 25 * 60)
# How long one dispatch task keeps claiming before it hands over to the next
# task; bounded so that django-q2's task timeout stays meaningful.
GPUSCHED_DISPATCH_BUDGET = env_float("GPUSCHED_DISPATCH_BUDGET", 120)
# On Ctrl-C, how long `make run` waits for each dispatcher to finish the job
# it runs before it stops the dispatcher at once (the job's lease then
# re-queues it at the next start); long enough for the demo's video.
GPUSCHED_STOP_SECONDS = env_float("GPUSCHED_STOP_SECONDS", 60)
# Where `make run` keeps the demo member's token, so that it outlives a restart.
GPUSCHED_DEMO_TOKEN_FILE = Path(
    os.environ.get("GPUSCHED_DEMO_TOKEN_FILE", "").strip() or VAR_DIR / "demo-token"
)
# Finished jobs older than this many days are pruned, with their events,
# decisions and webhook deliveries, once a day (manage.py prune_jobs); 0 turns
# the daily prune off.
GPUSCHED_RETENTION_DAYS = env_float("GPUSCHED_RETENTION_DAYS", 30)
# The pg_dump and pg_restore that `manage.py backup` and `restore` run; empty:
# those pgserver ships (gpusched/pg_archive.py). A pg_dump must be at least
# the server's major version.
GPUSCHED_PG_DUMP = os.environ.get("GPUSCHED_PG_DUMP", "").strip()
GPUSCHED_PG_RESTORE = os.environ.get("GPUSCHED_PG_RESTORE", "").strip()
WEBHOOK_ALLOWED_NETWORKS = env_list("WEBHOOK_ALLOWED_NETWORKS")
WEBHOOK_TIMEOUT_SECONDS = env_float("GPUSCHED_WEBHOOK_TIMEOUT", 15)
# Pause before each retry, in seconds (5 s, 5 min, 30 min, 2 h, 5 h, 10 h).
WEBHOOK_RETRY_SCHEDULE = [
    float(step)
    for step in env_list("GPUSCHED_WEBHOOK_RETRY_SCHEDULE", "5,300,1800,7200,18000,36000")
]
# Where receivers reach gpusched: the base of the links in a webhook's body.
GPUSCHED_PUBLIC_URL = (
    os.environ.get("GPUSCHED_PUBLIC_URL", "").strip()
    or f"http://127.0.0.1:{os.environ.get('PORT', '8000')}"
).rstrip("/")

# django-q2: one cluster per GPU ("dispatch-<gpu>"), with a single worker, owns the GPU. The
# task timeout must exceed the longest upstream call plus one dispatch budget,
# and `retry` must exceed the timeout, or the ORM broker re-delivers a task
# that is still running (harmless, as the job row guards the GPU, but noisy).
_gpu_task_timeout = int(GPUSCHED_JOB_TIMEOUT + GPUSCHED_DISPATCH_BUDGET + 60)
Q_CLUSTER = {
    "name": "gpusched",
    # Each GPU's dispatcher is a cluster of its own, with a queue of its own.
    "cluster_name": dispatch_cluster_name(GPUSCHED_GPU),
    "orm": "default",
    "workers": 1,
    "recycle": 500,
    "timeout": _gpu_task_timeout,
    "retry": _gpu_task_timeout + 60,
    "max_attempts": 1,
    "queue_limit": 2,
    "bulk": 1,
    "poll": env_float("GPUSCHED_QUEUE_POLL", 0.1),
    "catch_up": False,
    "save_limit": 200,
    "ack_failures": True,
    "label": "GPU dispatch",
    # `Q_CLUSTER_NAME=webhooks manage.py qcluster`: deliveries run here, so a
    # slow receiver never delays a dispatch and a long job never delays a delivery.
    "ALT_CLUSTERS": {
        "webhooks": {
            "workers": 2,
            "timeout": 120,
            "retry": 180,
            "queue_limit": 4,
            "label": "webhook delivery",
        }
    },
}

# The terminal shows what a person follows: gpusched's own warnings and one
# line per job started or finished (`gpusched.activity`). The libraries that
# speak at INFO on every poll and request (django-q2, httpx, Daphne) show
# only their warnings unless GPUSCHED_LOG_LEVEL=DEBUG.
LOG_LEVEL = (os.environ.get("GPUSCHED_LOG_LEVEL") or "INFO").upper()
_LIBRARY_LEVEL = (
    LOG_LEVEL if LOG_LEVEL == "DEBUG" else max(LOG_LEVEL, "WARNING", key=logging.getLevelName)
)
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "activity": {"format": "%(asctime)s %(message)s", "datefmt": "%H:%M:%S"},
        "bare": {"format": "%(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
        "activity": {"class": "logging.StreamHandler", "formatter": "activity"},
        # One JSON object per line, nothing around it, so a day greps and parses.
        "json_lines": {"class": "logging.StreamHandler", "formatter": "bare"},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "gpusched.activity": {
            "handlers": ["activity"],
            "level": max(LOG_LEVEL, "INFO", key=logging.getLevelName),
            "propagate": False,
        },
        "gpusched.decisions": {
            # `make run` sends them to a file instead (GPUSCHED_DECISION_LOG_CONSOLE=0),
            # where they do not bury the activity lines.
            "handlers": []
            if os.environ.get("GPUSCHED_DECISION_LOG_CONSOLE") == "0"
            else ["json_lines"],
            "level": "INFO",
            "propagate": False,
        },
        # django-q2 logs as "django-q" (django_q/conf.py).
        **{
            name: {"level": _LIBRARY_LEVEL}
            for name in ("django-q", "httpx", "httpcore", "daphne", "django.channels.server")
        },
    },
}
# Also append the decision lines to a file (one JSON object per line), for an
# operator to keep and grep; reopened when log rotation moves it.
GPUSCHED_DECISION_LOG = os.environ.get("GPUSCHED_DECISION_LOG", "")
if GPUSCHED_DECISION_LOG:
    LOGGING["handlers"]["decision_file"] = {
        "class": "logging.handlers.WatchedFileHandler",
        "filename": GPUSCHED_DECISION_LOG,
        "formatter": "bare",
    }
    LOGGING["loggers"]["gpusched.decisions"]["handlers"].append("decision_file")
