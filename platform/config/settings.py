"""Settings for both deployments from one codebase.

No environment variables: the *embedded default* (SQLite under var/, kombu's filesystem broker, the
in-process live bus, a local Ray head). With DATABASE_URL and REDIS_URL: the production stack
(PostgreSQL through psycopg 3, Redis as Celery broker and live bus). Every variable is documented
in README.md (Configuration).
"""

from __future__ import annotations

import os
from pathlib import Path

from kombu import Exchange, Queue

from config.env import (
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
    parse_database_url,
    platform_url_host,
    proxy_ssl_header,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent  # the repository root
PLATFORM_DIR = BASE_DIR / "platform"
VAR_DIR = Path(env_str("VAR_DIR") or BASE_DIR / "var").resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

DATABASE_URL = env_str("DATABASE_URL")
REDIS_URL = env_str("REDIS_URL")

DEBUG = env_bool("DJANGO_DEBUG", default=True)
_DEV_SECRET_KEY = "insecure-dev-key-only-for-the-embedded-default-do-not-deploy"
SECRET_KEY = env_str("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise SystemExit("error: DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off")
    SECRET_KEY = _DEV_SECRET_KEY

# Where the engine reports metrics back to (its HTTP sink posts to PLATFORM_URL + /api/...). In a compose
# or cluster deployment this is an internal name (http://web:8000); it is always an allowed host, so the
# engine's ingestion is never refused with a 400 whatever DJANGO_ALLOWED_HOSTS lists.
PLATFORM_URL = env_str("PLATFORM_URL", "http://127.0.0.1:8000").rstrip("/")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
_platform_host = platform_url_host(PLATFORM_URL)
if _platform_host and _platform_host not in ALLOWED_HOSTS and "*" not in ALLOWED_HOSTS:
    ALLOWED_HOSTS.append(_platform_host)
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

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
    "drf_spectacular_sidecar",
    "channels",
    "core",
    "accounts",
    "experiments",
    "tracking",
    "launcher",
    "alerts",  # alerts, metric rules, webhooks
    "sweeps",  # sweeps
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
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
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

# Test databases carry the test runner's PID so that two suites running at once never share one; the
# suite's own Celery workers and servers are pointed at it explicitly (tests/conftest.py).
_TEST_SUFFIX = str(os.getpid())
if DATABASE_URL:
    # Per process (web, worker, beat): a worker needs one for each of its threads (--concurrency).
    _db = parse_database_url(DATABASE_URL).as_django(pool_size=env_int("DATABASE_POOL_SIZE", 20))
    _db["TEST"] = {"NAME": f"test_{_db['NAME']}_{_TEST_SUFFIX}"}
    DATABASES = {"default": _db}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": Path(env_str("SQLITE_PATH") or VAR_DIR / "db.sqlite3"),
            # Several processes (web server, Celery worker) share the file: wait on locks instead of failing.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL;",
            },
            # A file, not :memory:, so that the test suite's Celery workers and servers see the test DB.
            "TEST": {"NAME": str(VAR_DIR / f"test_db_{_TEST_SUFFIX}.sqlite3")},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns on every start while collectstatic has not run
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
# whitenoise serves static files from the ASGI app itself: from the source folders while DEBUG is on,
# from STATIC_ROOT (after `collectstatic`) in production.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

# --- Security (production: DJANGO_DEBUG=0) ---------------------------------------------------------
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", default=not DEBUG)
# Never redirected to HTTPS: the engine's ingestion (posted to PLATFORM_URL, plain HTTP on the cluster's
# internal network; a redirected POST is a lost batch) and the health check (probed inside the network).
SECURE_REDIRECT_EXEMPT = [r"^api/runs/\d+/(metrics|events|samples|heartbeat)$", r"^api/health/$"]
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
# Behind a TLS-terminating proxy, set DJANGO_SECURE_PROXY_SSL_HEADER to the header it sets (usually
# X-Forwarded-Proto): requests carrying "https" there count as secure. Only then: without a proxy that
# overwrites it, any client could send the header and pass for HTTPS.
SECURE_PROXY_SSL_HEADER = proxy_ssl_header(env_str("DJANGO_SECURE_PROXY_SSL_HEADER"))
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# --- REST API ---------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON that never fails on a stored value strict JSON cannot hold (core.renderers).
    "DEFAULT_RENDERER_CLASSES": [
        "core.renderers.SafeJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "core.api_errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "RL platform API",
    "DESCRIPTION": "Experiments, runs, metrics and events of the asynchronous RL post-training platform.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Serve Swagger UI's assets from the installed sidecar package, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # the alerts app's choice sets by name (several serializers have a "kind")
    "ENUM_NAME_OVERRIDES": {
        "AlertKindEnum": "alerts.models.AlertKind",
        "RuleKindEnum": "alerts.models.RuleKind",
        "GoalEnum": "alerts.models.Goal",
        "MembershipRoleEnum": "accounts.models.Role",
        # a multi-turn episode's turn (rl_engine.wire.TurnIn.role): the policy's or the environment's
        "TurnRoleEnum": ["assistant", "user", "tool"],
    },
}

# --- Celery -----------------------------------------------------------------------------------------
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None  # tasks record their outcome in the database; no result store needed
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# One queue name per deployment (tests give each suite its own so that concurrent suites never share).
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "celery")
# A Redis that is connected but silent (paused, a hung proxy) fails a broker publish or a cache read after
# this long instead of holding the web worker: a launch or cancel stays recorded in the database for the
# launcher's sweep (launcher.lifecycle), a throttled request answers 503 with Retry-After. Above kombu's
# 1 s BRPOP, so a worker's wait never trips it.
REDIS_SOCKET_TIMEOUT_S = env_float("REDIS_SOCKET_TIMEOUT_S", 3.0)
REDIS_CLIENT_TIMEOUTS = {
    "socket_timeout": REDIS_SOCKET_TIMEOUT_S,
    "socket_connect_timeout": REDIS_SOCKET_TIMEOUT_S,
}
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    # kombu's Redis transport, safe to use after Redis went away under a running worker (see the class).
    CELERY_BROKER_TRANSPORT = "launcher.broker:RedisTransport"
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "visibility_timeout": 3600,
        **REDIS_CLIENT_TIMEOUTS,
    }
else:
    _broker_dir = VAR_DIR / "celery" / "broker"
    _control_dir = VAR_DIR / "celery" / "control"
    for _d in (_broker_dir, _control_dir):
        _d.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "launcher.broker:AtomicFilesystemTransport"  # kombu's, with atomic writes
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "control_folder": str(_control_dir),
        "store_processed": False,
        "polling_interval": 0.1,
    }

# --- Live bus (tracking/bus.py) ------------------------------------------------------------------------
# Websocket consumers also read the database every LIVE_POLL_INTERVAL_S seconds (0: never, except while
# the bus is unreachable). The in-process bus of the embedded default cannot carry a Celery worker's
# messages: there the poll is how status changes reach the browser (1.5 s). With Redis the bus carries
# everything and the poll is only a safety net (10 s). Channels' channel layer is not used.
LIVE_POLL_INTERVAL_S = float(env_str("LIVE_POLL_INTERVAL_S") or (10.0 if REDIS_URL else 1.5))
# A web process's bus reader that heard nothing from Redis for this long pings it; a ping unanswered for
# as long again (Redis paused, a hung proxy) gives the bus up: its websockets follow the database.
LIVE_BUS_SILENT_S = float(env_str("LIVE_BUS_SILENT_S") or 1.0)
# Redis pub/sub channels "<prefix>:live:<run id>"; deployments sharing one Redis are told apart by their
# queue name. None: in process.
LIVE_BUS = (
    {
        "url": REDIS_URL,
        "prefix": "rlp" if CELERY_TASK_DEFAULT_QUEUE == "celery" else f"rlp:{CELERY_TASK_DEFAULT_QUEUE}",
    }
    if REDIS_URL
    else None
)

# --- Launcher / engine ------------------------------------------------------------------------------
# "local": a Ray head started for the platform on this machine; "address": an existing cluster.
RAY_PROVIDER = env_str("RAY_PROVIDER", "local")
RAY_ADDRESS = env_str("RAY_ADDRESS")  # dashboard address of an existing cluster (provider "address")
RAY_LOCAL_NUM_CPUS = env_int("RAY_LOCAL_NUM_CPUS", 0)  # 0: all cores
RAY_LOCAL_DIR = env_str("RAY_LOCAL_DIR")  # state, lock and log of the local head; default VAR_DIR/ray
RUN_CONCURRENCY_LIMIT = env_int("RUN_CONCURRENCY_LIMIT", 2)
RUN_CONCURRENCY_LIMIT_PER_PROJECT = env_int("RUN_CONCURRENCY_LIMIT_PER_PROJECT", 0)  # 0: no per-project cap
RUN_HEARTBEAT_TIMEOUT_S = env_int("RUN_HEARTBEAT_TIMEOUT_S", 120)
# A running run whose engine stores no new step and reports no status or checkpoint for this long is
# failed and its job stopped (a deadlocked engine keeps heartbeating). 0: never.
RUN_STALL_TIMEOUT_S = env_int("RUN_STALL_TIMEOUT_S", 1800)
ENGINE_PYTHON = env_str("ENGINE_PYTHON")  # interpreter for the Ray job; default: the platform's own
ENGINE_WORKDIR = env_str("ENGINE_WORKDIR")  # the job's working dir on the cluster; default: this repository
# Extra variables of the worker's environment a local Ray head (so every job) may inherit, beyond the
# allow-list of launcher.job_env (naming a secret here hands it to every job and its model code).
ENGINE_ENV_PASSTHROUGH = env_list("ENGINE_ENV_PASSTHROUGH", [])
# A cancel waits what the engine reports a graceful stop needs (Run.stop_grace_s), at least RUN_CANCEL_GRACE_S
# and at most RUN_CANCEL_GRACE_MAX_S, the local head's SIGTERM -> SIGKILL delay (launcher.supervisor.cancel).
RUN_CANCEL_GRACE_S = env_int("RUN_CANCEL_GRACE_S", 5)
RUN_CANCEL_GRACE_MAX_S = env_int("RUN_CANCEL_GRACE_MAX_S", 300)
# A token issued for a username and password (POST /api/tokens/login, rlp login) lives at most this long.
LOGIN_TOKEN_LIFETIME_DAYS = env_int("LOGIN_TOKEN_LIFETIME_DAYS", 30)
LAUNCHER_LEASE_S = env_int("LAUNCHER_LEASE_S", 15)  # a supervisor silent this long is replaced
LAUNCHER_SWEEP_INTERVAL_S = env_int("LAUNCHER_SWEEP_INTERVAL_S", 3)  # reaper / re-attach / queue period
# Launcher tasks (some follow a job for its whole life) get their own queue so they never hold up others.
CELERY_LAUNCHER_QUEUE = env_str("CELERY_LAUNCHER_QUEUE") or CELERY_TASK_DEFAULT_QUEUE
# Webhook deliveries always get a queue of their own: an attempt to a receiver that never answers holds
# a worker thread for WEBHOOK_TIMEOUT_S, and must never make starts and cancels wait behind it.
CELERY_DELIVERY_QUEUE = env_str("CELERY_DELIVERY_QUEUE") or f"{CELERY_TASK_DEFAULT_QUEUE}-deliveries"
CELERY_TASK_ROUTES = {
    "launcher.*": {"queue": CELERY_LAUNCHER_QUEUE},
    "alerts.deliver_webhook": {"queue": CELERY_DELIVERY_QUEUE},
}
# The queues a worker started without -Q consumes: the default one and the deliveries' (a worker given
# -Q consumes what it lists: list both, docs/deploy.md). A launcher queue of its own is left to -Q.
CELERY_TASK_QUEUES = [
    Queue(name, Exchange(name), routing_key=name)
    for name in dict.fromkeys([CELERY_TASK_DEFAULT_QUEUE, CELERY_DELIVERY_QUEUE])
]
# The sweep runs from `celery worker -B` (embedded beat) or a separate `celery beat`.
CELERY_BEAT_SCHEDULE = {
    "launcher-sweep": {
        "task": "launcher.sweep",
        "schedule": float(LAUNCHER_SWEEP_INTERVAL_S),
        "options": {"expires": float(LAUNCHER_SWEEP_INTERVAL_S) * 2},  # no backlog after downtime
    },
}

# --- Alerts and webhooks (docs/deploy.md, "Alerts and webhooks") ---------------------------
# How often the metric rules are evaluated over running runs (a beat task; 0: never).
ALERT_RULES_INTERVAL_S = env_int("ALERT_RULES_INTERVAL_S", 60)
# Hosts a webhook may point at although they resolve to loopback, private, link-local addresses or
# the platform's own services (exact names or addresses; default: none).
WEBHOOK_ALLOWED_HOSTS = env_list("WEBHOOK_ALLOWED_HOSTS", [])
WEBHOOK_TIMEOUT_S = env_float("WEBHOOK_TIMEOUT_S", 10.0)  # one attempt: connect + answer
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 8)
# Attempt n+1 waits base * 2**(n-1) seconds after attempt n fails, at most WEBHOOK_RETRY_MAX_S
# (defaults: 10 s, 20 s, ... about 21 minutes in all over 8 attempts).
WEBHOOK_RETRY_BASE_S = env_float("WEBHOOK_RETRY_BASE_S", 10.0)
WEBHOOK_RETRY_MAX_S = env_float("WEBHOOK_RETRY_MAX_S", 600.0)
# How often beat re-sends webhook attempts overdue by more than this (their countdown task was lost: a
# worker killed, a broker restart) or abandoned mid-request by a dead worker (0: never, no beat entry).
WEBHOOK_SWEEP_INTERVAL_S = env_float("WEBHOOK_SWEEP_INTERVAL_S", 30.0)
# What one project can make the workers do (docs/api.md, "Trust boundary"): at most this many webhooks
# and metric rules (a create beyond is a 400), and at most this many webhook deliveries queued per hour
# for all its webhooks together (an alert opened beyond it notifies none; the alert says so). The
# project actions that queue work are throttled too (THROTTLE_ALERT_*, THROTTLE_WEBHOOK_WRITES below).
WEBHOOKS_PER_PROJECT = env_int("WEBHOOKS_PER_PROJECT", 10)
ALERT_RULES_PER_PROJECT = env_int("ALERT_RULES_PER_PROJECT", 50)
WEBHOOK_DELIVERIES_PER_HOUR = env_int("WEBHOOK_DELIVERIES_PER_HOUR", 300)
# Metric points one rule reads of one run in one pass (a new or changed rule catches up over passes).
ALERT_RULE_POINTS_PER_PASS = env_int("ALERT_RULE_POINTS_PER_PASS", 20000)
if ALERT_RULES_INTERVAL_S > 0:
    CELERY_BEAT_SCHEDULE["alerts-evaluate-rules"] = {
        "task": "alerts.evaluate_rules",
        "schedule": float(ALERT_RULES_INTERVAL_S),
        "options": {"expires": float(ALERT_RULES_INTERVAL_S)},  # no backlog after downtime
    }
if WEBHOOK_SWEEP_INTERVAL_S > 0:
    CELERY_BEAT_SCHEDULE["alerts-resend-deliveries"] = {
        "task": "alerts.resend_due_deliveries",
        "schedule": WEBHOOK_SWEEP_INTERVAL_S,
        "options": {"expires": WEBHOOK_SWEEP_INTERVAL_S},
    }

# --- Sweeps (docs/api.md, "Sweeps") ------------------------------------------------------------
SWEEP_MAX_RUNS = env_int("SWEEP_MAX_RUNS", 100)  # the most runs one sweep may make
# How often the median rule is applied to the running runs of sweeps that asked for early stopping
# (a beat task; 0: never).
SWEEP_EARLY_STOP_INTERVAL_S = env_int("SWEEP_EARLY_STOP_INTERVAL_S", 30)
if SWEEP_EARLY_STOP_INTERVAL_S > 0:
    CELERY_BEAT_SCHEDULE["sweeps-early-stop"] = {
        "task": "sweeps.early_stop",
        "schedule": float(SWEEP_EARLY_STOP_INTERVAL_S),
        "options": {"expires": float(SWEEP_EARLY_STOP_INTERVAL_S)},  # no backlog after downtime
    }

# --- Trust boundary: path policy, throttles, request limits (docs/api.md: "Trust boundary") -----------
# A config that comes through the platform may only name models under MODEL_ROOTS (or one of
# ALLOWED_MODELS, taken verbatim) and datasets under DATA_ROOTS; checkpoints and JSONL logs always go to
# the run's own folder (VAR_DIR/runs/<run>). The engine's own CLI is not bound by any of this.
MODEL_ROOTS = [Path(p).resolve() for p in env_list("MODEL_ROOTS", [str(VAR_DIR / "models")])]
DATA_ROOTS = [Path(p).resolve() for p in env_list("DATA_ROOTS", [str(VAR_DIR / "data")])]
ALLOWED_MODELS = env_list("ALLOWED_MODELS", [])
# Hub datasets (`org/name`) a config may name as data.path, as shell-style patterns ("*": any,
# "openai/*": one organisation, "none": no hub dataset). They are resolved through the hub and the
# datasets cache only, never as a folder in the engine's working directory.
ALLOWED_DATASETS = env_list("ALLOWED_DATASETS", ["*"])
# Whether data.allow_download may let `datasets` fetch a hub dataset (else: the datasets cache only).
ALLOW_DATASET_DOWNLOADS = env_bool("ALLOW_DATASET_DOWNLOADS", True)
# MLflow tracking servers (http(s) origins, e.g. http://mlflow:5000; "*": any) a config may log to. The
# engine sends the cluster's MLflow credentials to the server it names, so none is allowed by default;
# without a server a run's MLflow store lives in its own folder.
ALLOWED_MLFLOW_SERVERS = env_list("ALLOWED_MLFLOW_SERVERS", [])
# Remote reward services (reward name http: http(s) URLs, a listed entry allowing its path and below,
# e.g. http://grader:8808/score; "*": any) a config may send its samples to. The engine posts every
# prompt and response there, from inside the cluster, so none is allowed by default.
ALLOWED_REWARD_SERVICES = env_list("ALLOWED_REWARD_SERVICES", [])
# What a config from the platform may ask of the cluster: GPUs of the trainer group and of the
# rollouters together, CPUs per actor, and the custom Ray resources (node labels such as trainer_node)
# it may name in resources.*_node_resources. None by default; node:<address> never.
RUN_MAX_GPUS = env_int("RUN_MAX_GPUS", 64)
RUN_MAX_CPUS_PER_ACTOR = env_float("RUN_MAX_CPUS_PER_ACTOR", 64.0)
ALLOWED_NODE_RESOURCES = env_list("ALLOWED_NODE_RESOURCES", [])
# YAML import: documents larger than this are refused before parsing (a config is a few KB).
YAML_IMPORT_MAX_BYTES = env_int("YAML_IMPORT_MAX_BYTES", 200_000)
# Request bodies above this are a 413 (Django's default, 2.5 MB, would refuse a batch of 1000 samples
# with long responses; a 5000-point metrics batch is ~0.5 MB).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_BYTES", 10 * 1024 * 1024)
# Rates "<n>/<second|minute|hour|day>" of the throttled endpoints (429 with Retry-After beyond them).
# Ingestion is per run (its ingest token) or per user: an engine posts about 10 requests a second, and
# after an outage drains its spool back-to-back, so the default is far above what one engine can send.
THROTTLE_RATES = {
    "login": env_str("THROTTLE_LOGIN", "10/minute"),  # per client address and username
    "login_address": env_str("THROTTLE_LOGIN_ADDRESS", "60/minute"),  # per client address
    "token_create": env_str("THROTTLE_TOKEN_CREATE", "60/hour"),  # per user
    "ingest": env_str("THROTTLE_INGEST", "30000/minute"),  # per ingest token (run) or user
    # Heartbeats renew the ingest token: a bucket of their own, so a throttled backlog of data never
    # lets the token expire. An engine beats every 1-10 s (and once more after a 429).
    "heartbeat": env_str("THROTTLE_HEARTBEAT", "600/minute"),  # per ingest token (run) or user
    # Per project, whoever asks: actions that queue work for the workers (webhook deliveries, rule passes).
    "alert_events": env_str("THROTTLE_ALERT_EVENTS", "60/hour"),  # event POSTs with an alert, by members
    "alert_resolve": env_str("THROTTLE_ALERT_RESOLVE", "120/hour"),  # POST /api/alerts/{id}/resolve
    "alert_rule_writes": env_str("THROTTLE_ALERT_RULE_WRITES", "120/hour"),  # rule create, change, delete
    "webhook_writes": env_str("THROTTLE_WEBHOOK_WRITES", "60/hour"),  # webhook create, change, delete
}
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = THROTTLE_RATES
# Reverse proxies in front of the web server: the client address is taken that many hops back in
# X-Forwarded-For. 0 (default): the socket's peer address; a client-set header is ignored.
REST_FRAMEWORK["NUM_PROXIES"] = env_int("NUM_PROXIES", 0)
# Throttle counters live in the cache: Redis when there is one (shared by every web process), else
# process memory. Deployments that share one Redis are told apart by their queue name.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"rlp:{CELERY_TASK_DEFAULT_QUEUE}",
            "OPTIONS": dict(REDIS_CLIENT_TIMEOUTS),
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "rlp"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
