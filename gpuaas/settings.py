"""gpuaas settings: one env-driven file.

With no environment set, gpuaas runs embedded: SQLite under var/, kombu's SQLAlchemy broker on
a SQLite file under var/, and the built-in simulated cluster. Set DATABASE_URL, CELERY_BROKER_URL and register
clusters with real kubeconfigs to run on PostgreSQL, Redis and real clusters. See README.md.
"""

from __future__ import annotations

import hashlib
import tempfile
import tomllib
from datetime import timedelta
from pathlib import Path

from celery.schedules import crontab

from .env import (
    ConfigurationError,
    derived_credentials_key,
    env_bool,
    env_cache,
    env_database,
    env_fernet_keys,
    env_int,
    env_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
# The release, from pyproject.toml (in the image too): node agents report it, the cluster page shows it.
GPUAAS_VERSION = tomllib.loads((BASE_DIR / "pyproject.toml").read_text())["project"]["version"]
VAR_DIR = Path(env_str("GPUAAS_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

# Safe by default: DEBUG is off unless set; `make demo` and the test suite set DEBUG=1 themselves.
DEBUG = env_bool("DEBUG", False)
# control-plane (web, workers, beat, ingest worker) or node-agent (NVML on a GPU node, no database).
GPUAAS_ROLE = env_str("GPUAAS_ROLE", "control-plane")
if GPUAAS_ROLE not in ("control-plane", "node-agent"):
    raise ConfigurationError(f"GPUAAS_ROLE must be control-plane or node-agent, got {GPUAAS_ROLE!r}")
# Public, in the source: accepted only with DEBUG=1 (a development machine).
PUBLIC_DEVELOPMENT_SECRET_KEY = "gpuaas-insecure-development-key-set-SECRET_KEY-in-production"
_SECRET_KEY_HINT = 'generate one with: python -c "import secrets; print(secrets.token_urlsafe(50))"'
SECRET_KEY = env_str("SECRET_KEY") or (PUBLIC_DEVELOPMENT_SECRET_KEY if DEBUG else "")
if GPUAAS_ROLE == "node-agent" and not SECRET_KEY:
    # An agent serves no web requests and signs with its node key: it must not need the project's secret.
    import secrets

    SECRET_KEY = secrets.token_urlsafe(50)
if not DEBUG:
    if not SECRET_KEY:
        raise ConfigurationError(f"SECRET_KEY is required when DEBUG is off; {_SECRET_KEY_HINT} (DEBUG=1: development)")
    if SECRET_KEY == PUBLIC_DEVELOPMENT_SECRET_KEY:
        raise ConfigurationError(f"SECRET_KEY is the public development key (DEBUG=1 only); {_SECRET_KEY_HINT}")
    if len(SECRET_KEY) < 50:
        raise ConfigurationError(f"SECRET_KEY must be at least 50 characters when DEBUG is off; {_SECRET_KEY_HINT}")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS and GPUAAS_ROLE != "node-agent":  # agents serve no HTTP
    raise ConfigurationError("ALLOWED_HOSTS is required when DEBUG is off (comma-separated host names)")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "gpuaas.apps.GpuaasAdminConfig",  # django.contrib.admin with gpuaas.admin.GpuaasAdminSite as admin.site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "guardian",
    "axes",
    "tenancy",
    "capacity",
    "pricing",
    "pools",
    "scheduling",
    "operations",
    "billing",
    "monitoring",
    "notifications",
    "gpuaas",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "gpuaas.middleware.UnsupportedMethodMiddleware",  # TRACE and unknown methods: 405 before any view
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "tenancy.oidc.middleware.SessionRefresh",  # renews OIDC sessions; inert while OIDC_ISSUER is empty
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "gpuaas.urls"
WSGI_APPLICATION = "gpuaas.wsgi.application"
ASGI_APPLICATION = "gpuaas.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "gpuaas" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenancy.oidc.context.sign_in",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
if GPUAAS_ROLE == "node-agent":
    # Node agents hold no database credentials: Django's dummy engine raises on any query, so ORM
    # use on an agent fails loudly (capacity/agent/, docs/security.md "Node agents").
    if env_str("DATABASE_URL"):
        raise ConfigurationError("DATABASE_URL must be unset for GPUAAS_ROLE=node-agent (agents have no database)")
    DATABASES = {"default": {"ENGINE": "django.db.backends.dummy"}}
else:
    DATABASES = {"default": env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'gpuaas.sqlite3'}")}
IS_POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if IS_POSTGRES:
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("CONN_MAX_AGE", 60, minimum=0)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = env_bool("CONN_HEALTH_CHECKS", True)
    # PostgreSQL's JIT compiles any plan above jit_above_cost: the dashboard's count over 300,000 units spent
    # 7.8 of its 14.7 s compiling (docs/dashboard.md). gpuaas runs no query long enough to repay it.
    if not env_bool("PG_JIT", False):
        options = DATABASES["default"].setdefault("OPTIONS", {})
        options["options"] = f"{options.get('options', '')} -c jit=off".strip()
else:
    # WAL and IMMEDIATE transactions let the demo's web server, worker and beat share one file.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth -----------------------------------------------------------------------------------
AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username+IP before the password is even checked (docs/security.md).
    "axes.backends.AxesStandaloneBackend",
    # Django's ModelBackend, whose password sign-in LOCAL_PASSWORDS=0 switches off (permissions stay).
    "tenancy.oidc.backend.LocalPasswordBackend",
    "tenancy.oidc.backend.OidcBackend",  # company sign-in; inert while OIDC_ISSUER is empty
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = "AnonymousUser"
GUARDIAN_RAISE_403 = False
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"  # members sign in here; the admin keeps its own /admin/login/

# Company sign-in (OpenID Connect, mozilla-django-oidc; docs/security.md "Company sign-in"). Deployment
# facts only: which group gives which role is data (tenancy.IdentityGroupRole, in the admin).
OIDC_ISSUER = env_str("OIDC_ISSUER", "").rstrip("/")
OIDC_RP_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "")
OIDC_RP_SCOPES = env_str("OIDC_SCOPES", "openid email profile")
OIDC_RP_SIGN_ALGO = env_str("OIDC_SIGN_ALGO", "RS256")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "your company account")
# A browser session signed in through the provider is renewed (prompt=none) this long after sign-in.
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS", 300, minimum=10)
# The provider's answer on a bearer token (valid, and the person's groups) is kept this long (0: never).
OIDC_BEARER_CACHE_SECONDS = env_int("OIDC_BEARER_CACHE_SECONDS", 30, minimum=0)
OIDC_API_AUDIENCE = env_str("OIDC_API_AUDIENCE", "") or OIDC_RP_CLIENT_ID
# gpa_ tokens of a person who signs in through the provider work only while their last check by the
# provider (sign-in, renewal or bearer request) is at most this many hours old (0: no limit).
OIDC_PERSONAL_TOKEN_RECHECK_H = env_int("OIDC_PERSONAL_TOKEN_RECHECK_H", 24, minimum=0)
OIDC_TIMEOUT = env_int("OIDC_TIMEOUT_S", 5, minimum=1)
OIDC_DISCOVERY_CACHE_S = env_int("OIDC_DISCOVERY_CACHE_S", 300, minimum=0)
OIDC_CLOCK_SKEW_S = 30
OIDC_USE_NONCE = True
OIDC_USE_PKCE = True
OIDC_EXEMPT_URLS = ["/accounts/logout/", "/healthz", "/readyz", "/metrics"]
OIDC_CREATE_USER = True
LOGIN_REDIRECT_URL = "/"
LOGIN_REDIRECT_URL_FAILURE = LOGIN_URL
LOCAL_PASSWORDS = env_bool("LOCAL_PASSWORDS", True)
if OIDC_ISSUER:
    for _name, _value in (("OIDC_CLIENT_ID", OIDC_RP_CLIENT_ID), ("OIDC_CLIENT_SECRET", OIDC_RP_CLIENT_SECRET)):
        if not _value:
            raise ConfigurationError(
                f"{_name} is required when OIDC_ISSUER is set (the client registered at the provider)"
            )
    if not (OIDC_ISSUER.startswith("https://") or (DEBUG and OIDC_ISSUER.startswith("http://"))):
        raise ConfigurationError(
            f"OIDC_ISSUER must be an https:// URL (http:// only with DEBUG=1), got {OIDC_ISSUER!r}"
        )
elif not LOCAL_PASSWORDS and GPUAAS_ROLE == "control-plane":
    raise ConfigurationError("LOCAL_PASSWORDS=0 needs OIDC_ISSUER: with neither, nobody could sign in")

# Login brute force (django-axes): both login pages (/admin/login/, /accounts/login/) go through
# authenticate(request=...), so both count failures. API tokens are not passwords: they never reach
# axes; the anon API throttle bounds guessing instead.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15, minimum=1))
# Two counts, either locks (docs/security.md "Login lockout"): one username's failures from any
# address (a distributed guess at one account) and one address's failures on any username (spraying).
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# A cool-off, never a permanent lock: attempts during a lockout are refused but not counted, so the
# lock ends AXES_COOLOFF_MINUTES after the failure that set it, whatever an attacker keeps sending.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True  # forgives the signed-in username's failures only (gpuaas.access.LockoutHandler)
# Failures live in the database: shared by every web process and host, listed in the admin
# (Axes > Access attempts, with an "Unlock" action), and `manage.py axes_reset` clears them all.
AXES_HANDLER = "gpuaas.access.LockoutHandler"
AXES_LOCKOUT_TEMPLATE = "registration/lockout.html"
AXES_VERBOSE = False  # no banner at every start; lockouts are still logged as warnings
# The client address is REMOTE_ADDR unless TRUSTED_PROXY_COUNT proxies (the ingress) append to
# X-Forwarded-For; django-ipware reads it (gpuaas.access.client_address), for axes and the API
# throttles alike: a forged header must not give an attacker a fresh address per attempt.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0, minimum=0)
AXES_CLIENT_IP_CALLABLE = "gpuaas.access.client_address"

# --- I18N / time ----------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- Static ---------------------------------------------------------------------------------
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# --- Security (TLS is terminated at the ingress; see README "Deploying") ---------------------
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenancy.authentication.ApiTokenAuthentication",
        "tenancy.oidc.authentication.OidcBearerAuthentication",  # the provider's access tokens (OIDC_ISSUER)
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["core.permissions.DeclaredScope"],  # refuses a view that declares no scope
    "DEFAULT_PAGINATION_CLASS": "core.api.Pagination",
    "EXCEPTION_HANDLER": "core.api.exception_handler",  # domain refusals (DomainConflict) are 409s
    "PAGE_SIZE": env_int("API_PAGE_SIZE", 50, minimum=1),
    "DEFAULT_FILTER_BACKENDS": [
        "core.api.FilterBackend",  # integer filters bounded to their column's range
        "core.api.OrderingFilter",  # DRF's, with a NUL character refused as the schema says
    ],
    "DEFAULT_THROTTLE_CLASSES": [
        "gpuaas.access.AnonThrottle",  # per client address behind the ingress (TRUSTED_PROXY_COUNT)
        "gpuaas.access.UserThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env_str("API_THROTTLE_ANON", "60/minute"),
        "user": env_str("API_THROTTLE_USER", "6000/minute"),
    },
    "DEFAULT_SCHEMA_CLASS": "gpuaas.schema.ApiAutoSchema",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuaas API",
    "DESCRIPTION": "Self-service GPU capacity: projects, pool requests, pools, allocations, metrics and billing.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Request bodies are documented as JSON only: DRF still parses forms (the browsable API), but a form
    # cannot carry what the JSON schema says (a null, a number, a nested object), so documenting form
    # bodies promised requests that are refused.
    "PARSER_WHITELIST": ["rest_framework.parsers.JSONParser"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gpuaas.schema.require_decimal_digits",
        "gpuaas.schema.refuse_nul_in_text",
    ],
    # One OpenAPI enum per choice set, whatever the field is called.
    "ENUM_NAME_OVERRIDES": {
        "SpecKindEnum": "capacity.choices.SpecKind",
        "ReconfigurationStepEnum": "capacity.choices.ReconfigurationStep",
        "ReconfigurationStateEnum": "capacity.choices.ReconfigurationState",
        "ReconfigurationBackendEnum": "capacity.choices.ReconfigurationBackend",
        "ReconfigurationEventEnum": "capacity.choices.ReconfigurationEvent",
        "DrainStepEnum": "capacity.choices.DrainStep",
        "RequestStateEnum": "pools.choices.RequestState",
        "PoolStateEnum": "pools.choices.PoolState",
        "IsolationNeedEnum": "pools.choices.IsolationNeed",
        "IsolationOrNeedEnum": "pools.choices.ISOLATION_OR_NEED",
        "RoleEnum": "tenancy.choices.Role",
        "StatementStateEnum": "billing.choices.StatementState",
        "LineTypeEnum": "billing.choices.LineType",
        "BillingRunKindEnum": "billing.choices.RunKind",
        "BillingRunStatusEnum": "billing.choices.RunStatus",
        "OnboardingStatusEnum": "capacity.choices.OnboardingStatus",
        "ClusterStatusEnum": "capacity.choices.ClusterStatus",
    },
}

# --- Cache (API throttling state) -------------------------------------------------------------
# Shared by every process: CACHE_URL, else REDIS_URL, else a Redis CELERY_BROKER_URL, else files
# under var/cache/ (shared by the processes of one host: the embedded default). Never per-process.
_broker_url = env_str("CELERY_BROKER_URL", "")
CACHES = {
    "default": env_cache(
        "CACHE_URL",
        env_str("REDIS_URL")
        or (_broker_url if _broker_url.startswith(("redis://", "rediss://")) else "")
        or f"file://{VAR_DIR / 'cache'}",
    )
}

# --- Celery ---------------------------------------------------------------------------------
# Embedded default: kombu's SQLAlchemy transport on a SQLite file. Its consumers claim a message inside
# BEGIN IMMEDIATE, so concurrent workers never see half-written or doubly delivered messages (the
# filesystem transport did: kombu's open bug of a reader decoding a partially written file).
EMBEDDED_BROKER_PATH = VAR_DIR / "celery-broker.sqlite3"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", f"sqla+sqlite:///{EMBEDDED_BROKER_PATH}")
_BROKER_SCHEMES = {"sqla+sqlite", "redis", "rediss", "memory"}
if CELERY_BROKER_URL.split("://")[0] not in _BROKER_SCHEMES:
    raise ConfigurationError(
        f"CELERY_BROKER_URL must be redis://, rediss:// or sqla+sqlite:///PATH (embedded), got {CELERY_BROKER_URL!r}"
    )
CELERY_LONGEST_TASK_S = 30 * 60
if CELERY_BROKER_URL.startswith("sqla+sqlite://"):
    # create_engine() options: wait up to 30 s for another process's write lock instead of failing
    # with "database is locked" after SQLite's default 5 s.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"connect_args": {"timeout": 30}}
elif CELERY_BROKER_URL.startswith("memory://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
else:
    # Redis redelivers unacknowledged messages after visibility_timeout: keep it above the longest task.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_LONGEST_TASK_S * 2}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = CELERY_LONGEST_TASK_S
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_LONGEST_TASK_S - 60
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    "capacity.tasks.discover_cluster_task": {"queue": "discovery"},
    "capacity.tasks.discover_all_task": {"queue": "discovery"},
    "monitoring.tasks.*": {"queue": "metrics"},
    "billing.tasks.*": {"queue": "billing"},
}
# The node agent's tasks live outside the apps' tasks modules.
CELERY_IMPORTS = ["capacity.agent.tasks"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- Recovery of long operations (core/leases.py; docs/reliability.md) -----------------------
# A claimed workflow step holds a lease that its worker renews every third of it; once a lease runs
# out (worker SIGKILLed, message lost), the next sweep re-enqueues the work. Recovery takes at most
# WORKFLOW_LEASE_S + WORKFLOW_SWEEP_S: keep the sum under a minute.
WORKFLOW_LEASE_S = env_int("WORKFLOW_LEASE_S", 20, minimum=2)
WORKFLOW_SWEEP_S = env_int("WORKFLOW_SWEEP_S", 30, minimum=1)
# Level-triggered reconcile of every provisioned pool's Kubernetes objects (quota, labels, namespace).
POOL_RECONCILE_INTERVAL_S = env_int("POOL_RECONCILE_INTERVAL_S", 60, minimum=1)

# --- Capacity: discovery, MIG reconfiguration, time-slicing (docs/discovery.md, docs/mig.md) -----
DISCOVERY_INTERVAL_S = env_int("DISCOVERY_INTERVAL_S", 60, minimum=5)
# The tier plan's maintenance reserve: per cluster and tier, the units of this many GPUs (those carrying the
# most) are held back so one can be drained for a driver, firmware or MIG change without refusing work
# (docs/tiers.md, "Capacity plan per tier"). 0 plans without a reserve.
CAPACITY_MAINTENANCE_RESERVE_GPUS = env_int("CAPACITY_MAINTENANCE_RESERVE_GPUS", 1, minimum=0)
GPU_OPERATOR_NAMESPACE = env_str("GPU_OPERATOR_NAMESPACE", "gpu-operator")
# gpuaas's own mig-parted ConfigMap; point the ClusterPolicy's spec.migManager.config.name at it.
MIG_PARTED_CONFIGMAP = env_str("MIG_PARTED_CONFIGMAP", "gpuaas-mig-parted-config")
# The device plugin's config ConfigMap (ClusterPolicy spec.devicePlugin.config.name).
TIME_SLICING_CONFIGMAP = env_str("TIME_SLICING_CONFIGMAP", "time-slicing-config")
# Kubelet refreshes the MIG manager's mounted copy of that ConfigMap up to about a minute after a
# write (sync period + cache TTL): gpuaas sets nvidia.com/mig.config this long after writing a config.
MIG_PARTED_SYNC_S = env_int("MIG_PARTED_SYNC_S", 90, minimum=0)
# Waiting steps re-check with this countdown: far below the Redis visibility timeout.
MIG_RECONFIG_POLL_S = env_int("MIG_RECONFIG_POLL_S", 5, minimum=1)
if MIG_RECONFIG_POLL_S * 10 > CELERY_LONGEST_TASK_S:
    raise ConfigurationError("MIG_RECONFIG_POLL_S must stay far below the broker visibility timeout")
MIG_DRAIN_TIMEOUT_S = env_int("MIG_DRAIN_TIMEOUT_S", 900, minimum=10)
MIG_APPLY_TIMEOUT_S = env_int("MIG_APPLY_TIMEOUT_S", 1200, minimum=10)
# Agent backend: the MIG command goes out again when no signed result came back this long after it.
MIG_AGENT_RESEND_S = env_int("MIG_AGENT_RESEND_S", 120, minimum=1)
MIG_VERIFY_TIMEOUT_S = env_int("MIG_VERIFY_TIMEOUT_S", 300, minimum=10)
MIG_RECONFIG_SWEEP_S = env_int("MIG_RECONFIG_SWEEP_S", WORKFLOW_SWEEP_S, minimum=1)
# Drain-and-move (docs/maintenance.md): notice before the moved pods are evicted, and how long after that
# notice's deadline PodDisruptionBudgets may hold pods on the node before the drain fails.
MAINTENANCE_GRACE_S = env_int("MAINTENANCE_GRACE_S", 3600, minimum=0)
MAINTENANCE_EVICT_TIMEOUT_S = env_int("MAINTENANCE_EVICT_TIMEOUT_S", 900, minimum=10)
# Rolling driver upgrades (docs/maintenance.md): the largest wave when the cluster has no ClusterPolicy, how
# long a handed-over node may take to come back (upgrade-done, or given back, and healthy) before it is
# marked failed, and how often a rollout's tick looks again.
DRIVER_UPGRADE_MAX_PARALLEL = env_int("DRIVER_UPGRADE_MAX_PARALLEL", 1, minimum=1)
DRIVER_UPGRADE_TIMEOUT_S = env_int("DRIVER_UPGRADE_TIMEOUT_S", 2 * 3600, minimum=60)
DRIVER_UPGRADE_POLL_S = env_int("DRIVER_UPGRADE_POLL_S", 30, minimum=1)

# --- Pools: limits and expiry of pool requests (docs/pools.md) ------------------------------------
POOL_EXPIRY_NOTICE_S = env_int("POOL_EXPIRY_NOTICE_S", 3600, minimum=0)
POOL_EXPIRY_INTERVAL_S = env_int("POOL_EXPIRY_INTERVAL_S", 60, minimum=5)
# The most units one pool request may ask for (the API answers 400 above it).
POOL_REQUEST_MAX_UNITS = env_int("POOL_REQUEST_MAX_UNITS", 512, minimum=1)

# --- Queue: fair share, processing, forecast (docs/queue.md) --------------------------------------
# Fair share counts each project's GPU-hours reserved over this many past hours, over its weight.
QUEUE_FAIR_SHARE_WINDOW_H = env_int("QUEUE_FAIR_SHARE_WINDOW_H", 168, minimum=1)
# Fair share orders a request only for its first hours of waiting: after this many it is served by age
# within its priority class, and no later request of its class overtakes it (0: fair share always orders).
QUEUE_AGED_AFTER_H = env_int("QUEUE_AGED_AFTER_H", 1, minimum=0)
# A pass over the queue after every release, and on this beat too (a node back, a reconfiguration done).
QUEUE_PROCESS_INTERVAL_S = env_int("QUEUE_PROCESS_INTERVAL_S", 60, minimum=5)
QUEUE_FORECAST_INTERVAL_S = env_int("QUEUE_FORECAST_INTERVAL_S", 300, minimum=10)
QUEUE_FORECAST_DRAWS = env_int("QUEUE_FORECAST_DRAWS", 200, minimum=1)
QUEUE_FORECAST_SEED = env_int("QUEUE_FORECAST_SEED", 17, minimum=0)
QUEUE_FORECAST_MIN_SAMPLES = env_int("QUEUE_FORECAST_MIN_SAMPLES", 5, minimum=1)
# Later arrivals (taking units at submission, or ranking ahead) are expected at the rate seen over this
# window (0: not foreseen).
QUEUE_FORECAST_ARRIVALS_WINDOW_H = env_int("QUEUE_FORECAST_ARRIVALS_WINDOW_H", 168, minimum=0)
# With no history: open-ended pools are expected to hold this long; an overdue one to end within OVERDUE.
QUEUE_FORECAST_DEFAULT_HOLD_H = env_int("QUEUE_FORECAST_DEFAULT_HOLD_H", 24, minimum=1)
QUEUE_FORECAST_OVERDUE_H = env_int("QUEUE_FORECAST_OVERDUE_H", 1, minimum=0)
# A MIG reconfiguration that would make room is expected to be done within this long.
QUEUE_FORECAST_RECONFIGURATION_S = env_int("QUEUE_FORECAST_RECONFIGURATION_S", 900, minimum=0)
# A draw that has not started its request this long after now says "not within the horizon" (None).
QUEUE_FORECAST_HORIZON_H = env_int("QUEUE_FORECAST_HORIZON_H", 720, minimum=1)

# --- Monitoring: collection, storage, health, idle reservations (docs/monitoring.md) ------------
METRICS_INTERVAL_S = env_int("METRICS_INTERVAL_S", 30, minimum=5)
# Seconds into a poll period when the nodes without a report for it are asked once more (an agent that
# died mid-read loses its messages until Redis's visibility timeout, an hour, long after they expired).
METRICS_REPOLL_AFTER_S = env_int("METRICS_REPOLL_AFTER_S", METRICS_INTERVAL_S * 2 // 3, minimum=1)
# A node agent with no report accepted for three of its periods (metrics polls, or discovery's inventory reads
# where a DCGM exporter gives the metrics) shows as stale on the cluster page (NodeCapacity.agent_health).
AGENT_STALE_AFTER_S = 3 * max(METRICS_INTERVAL_S, DISCOVERY_INTERVAL_S)
if METRICS_REPOLL_AFTER_S >= METRICS_INTERVAL_S:
    raise ConfigurationError(
        "METRICS_REPOLL_AFTER_S must be below METRICS_INTERVAL_S (the re-poll is within the period)"
    )


def _int_set(name: str, default: str) -> frozenset[int]:
    """Parse "48,63,79" into {48, 63, 79}; anything that is not a list of integers stops start-up."""
    values = env_list(name, default.split(","))
    if not all(v.isdigit() for v in values):
        raise ConfigurationError(f"{name}={','.join(values)!r} must be comma-separated integers (XID codes)")
    return frozenset(int(v) for v in values)


MONITORING_GPM_INTERVAL_MS = env_int("MONITORING_GPM_INTERVAL_MS", 150, minimum=101)
MONITORING_DCGM_TIMEOUT_S = env_int("MONITORING_DCGM_TIMEOUT_S", 5, minimum=1)
MONITORING_COPY_MIN_ROWS = env_int("MONITORING_COPY_MIN_ROWS", 200, minimum=1)
# Off: sample transactions commit without waiting for the WAL flush (telemetry; see docs/monitoring.md).
MONITORING_SYNCHRONOUS_COMMIT = env_bool("MONITORING_SYNCHRONOUS_COMMIT", False)
MONITORING_RETENTION_RAW_DAYS = env_int("MONITORING_RETENTION_RAW_DAYS", 7, minimum=1)
MONITORING_RETENTION_5M_DAYS = env_int("MONITORING_RETENTION_5M_DAYS", 90, minimum=1)
MONITORING_RETENTION_1H_DAYS = env_int("MONITORING_RETENTION_1H_DAYS", 0, minimum=0)  # 0 = keep forever
MONITORING_RETENTION_BATCH = env_int("MONITORING_RETENTION_BATCH", 50_000, minimum=100)
MONITORING_RETENTION_INTERVAL_S = env_int("MONITORING_RETENTION_INTERVAL_S", 3600, minimum=60)
MONITORING_ROLLUP_INTERVAL_S = env_int("MONITORING_ROLLUP_INTERVAL_S", 300, minimum=30)
MONITORING_ROLLUP_GRACE_S = env_int("MONITORING_ROLLUP_GRACE_S", 60, minimum=0)
MONITORING_ROLLUP_LATENESS_S = env_int("MONITORING_ROLLUP_LATENESS_S", 600, minimum=0)
MONITORING_XID_CRITICAL = _int_set("MONITORING_XID_CRITICAL", "48,63,64,74,79,92,94,95")
MONITORING_XID_WARNING = _int_set("MONITORING_XID_WARNING", "13,31,43")
MONITORING_XID_CLEAR_S = env_int("MONITORING_XID_CLEAR_S", 3600, minimum=0)
MONITORING_THROTTLE_CLEAR_S = env_int("MONITORING_THROTTLE_CLEAR_S", 120, minimum=0)
MONITORING_CORDON_ON_CRITICAL = env_bool("MONITORING_CORDON_ON_CRITICAL", False)
MONITORING_IDLE_SM_PCT = env_int("MONITORING_IDLE_SM_PCT", 5, minimum=0)
MONITORING_IDLE_WINDOW_H = env_int("MONITORING_IDLE_WINDOW_H", 24, minimum=1)
MONITORING_IDLE_MIN_COVERAGE_PCT = env_int("MONITORING_IDLE_MIN_COVERAGE_PCT", 50, minimum=1)
MONITORING_IDLE_MEM_MIB = env_int("MONITORING_IDLE_MEM_MIB", 1024, minimum=0)
MONITORING_IDLE_INTERVAL_S = env_int("MONITORING_IDLE_INTERVAL_S", 3600, minimum=60)
MONITORING_SHARE_FACTOR_PCT = env_int("MONITORING_SHARE_FACTOR_PCT", 150, minimum=100)
MONITORING_EVICT_OVER_SHARE = env_bool("MONITORING_EVICT_OVER_SHARE", False)
# Trespass (docs/monitoring.md#trespass): activity on an unallocated unit above this SM percent (the seed
# calls >20% abnormal) or memory in use above this many MiB beyond the driver's own (learned per product and
# profile), sustained over this many consecutive polls; evict trespassing pods through the Eviction API.
MONITORING_TRESPASS_SM_PCT = env_int("MONITORING_TRESPASS_SM_PCT", 20, minimum=0)
MONITORING_TRESPASS_MEM_MIB = env_int("MONITORING_TRESPASS_MEM_MIB", 256, minimum=0)
MONITORING_TRESPASS_POLLS = env_int("MONITORING_TRESPASS_POLLS", 3, minimum=1)
MONITORING_EVICT_TRESPASS = env_bool("MONITORING_EVICT_TRESPASS", False)
# Bearer token Prometheus must send to /metrics; empty: operators' sessions only (DEBUG opens nothing).
MONITORING_METRICS_TOKEN = env_str("MONITORING_METRICS_TOKEN", "")

# --- Billing (docs/billing.md) --------------------------------------------------------------------
BILLING_CURRENCY = env_str("BILLING_CURRENCY", "EUR").upper()
if len(BILLING_CURRENCY) != 3 or not BILLING_CURRENCY.isalpha():
    raise ConfigurationError(f"BILLING_CURRENCY={BILLING_CURRENCY!r} is not an ISO 4217 code such as EUR")


def _gpu_prices(name: str, default: str, *, single: bool = False):
    """Parse "H100-80GB=2.50,H200-141GB=3.20" into {"H100-80GB": Decimal("2.50"), ...}; junk stops start-up.

    `single`: one price, "0.05", returned as a Decimal.
    """
    from decimal import Decimal, InvalidOperation

    if single:
        try:
            value = Decimal((env_str(name, default) or default).strip())
        except InvalidOperation:
            value = Decimal(-1)
        if not value.is_finite() or value < 0:
            raise ConfigurationError(f"{name}: give a price per hour >= 0, e.g. 0.05")
        return value
    prices = {}
    for item in env_list(name, default.split(",")):
        product, _, price = item.partition("=")
        try:
            value = Decimal(price.strip())
        except InvalidOperation:
            value = Decimal(-1)
        if not product.strip() or not value.is_finite() or value < 0:
            raise ConfigurationError(f"{name}: {item!r} is not PRODUCT=PRICE (e.g. H100-80GB=2.50)")
        prices[product.strip()] = value
    return prices


# Full-GPU price per hour by catalog product; MIG and time-slice prices derive from it.
BILLING_DEFAULT_GPU_HOURLY = _gpu_prices(
    "BILLING_DEFAULT_GPU_HOURLY", "H100-80GB=2.50,H200-141GB=3.20,A100-80GB=1.60,A100-40GB=1.20,A30-24GB=0.60"
)
# NVIDIA vGPU licence cost per vGPU-hour, added to a vGPU's derived price (full GPU / vGPUs per GPU).
BILLING_VGPU_LICENCE_HOURLY = _gpu_prices("BILLING_VGPU_LICENCE_HOURLY", "0.05", single=True)
BILLING_METER_INTERVAL_S = env_int("BILLING_METER_INTERVAL_S", 600, minimum=60)
# Credits and showback of the last N hours are recomputed after each metering pass.
BILLING_REFRESH_HOURS = env_int("BILLING_REFRESH_HOURS", 48, minimum=1)


# --- Periodic jobs ----------------------------------------------------------------------------


def every(seconds: int, task: str) -> dict:
    """A beat entry that runs `task` every `seconds` and expires after one period (no backlog piles up)."""
    return {"task": task, "schedule": timedelta(seconds=seconds), "options": {"expires": seconds}}


# --- Borrowing idle reservations (docs/queue.md, Borrowing) -----------------------------------------
# A unit idle (monitoring's detector) for at least this long may be lent to another project's queued request.
LENDING_IDLE_H = env_int("LENDING_IDLE_H", 24, minimum=1)
# Between the lender's need and the borrower's pods being evicted.
LENDING_RECLAIM_GRACE_S = env_int("LENDING_RECLAIM_GRACE_S", 120, minimum=0)
LENDING_RECONCILE_INTERVAL_S = env_int("LENDING_RECONCILE_INTERVAL_S", 30, minimum=5)
LENDING_INTERVAL_S = env_int("LENDING_INTERVAL_S", 600, minimum=30)

# --- Reservations that end (docs/pools.md, Ending) ------------------------------------------------
# After an allocation ends (release, expiry, reconfiguration, take-offline) its project's pods on the unit get
# this long to stop; then they are evicted through the Eviction API (PodDisruptionBudgets respected) and, if a
# budget still blocks them this many seconds later, deleted (the hard deadline). The unit stays "ending", and is
# handed to no other project, until no pod uses it. The sweep runs every ALLOCATION_ENDING_SWEEP_S.
ALLOCATION_ENDING_GRACE_S = env_int("ALLOCATION_ENDING_GRACE_S", 300, minimum=0)
ALLOCATION_ENDING_FORCE_AFTER_S = env_int("ALLOCATION_ENDING_FORCE_AFTER_S", 300, minimum=0)
ALLOCATION_ENDING_SWEEP_S = env_int("ALLOCATION_ENDING_SWEEP_S", WORKFLOW_SWEEP_S, minimum=1)


# --- Notifications (docs/notifications.md) -----------------------------------------------------
# Email through Django's backends: SMTP (EMAIL_HOST, default localhost:25 in production); with DEBUG=1 and no
# EMAIL_HOST, the console. EMAIL_BACKEND names any other Django backend.
_EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_HOST = _EMAIL_HOST or "localhost"
EMAIL_PORT = env_int("EMAIL_PORT", 587 if _EMAIL_HOST else 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", bool(_EMAIL_HOST))
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT_S", 10, minimum=1)
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.console.EmailBackend"
    if DEBUG and not _EMAIL_HOST
    else "django.core.mail.backends.smtp.EmailBackend",
)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpuaas@localhost")
# Links in messages point here (e.g. https://gpuaas.example.com); empty: paths only.
NOTIFY_BASE_URL = env_str("NOTIFY_BASE_URL", "").rstrip("/")
NOTIFY_WEBHOOK_TIMEOUT_S = env_int("NOTIFY_WEBHOOK_TIMEOUT_S", 10, minimum=1)
# Retries of a failed delivery: exponential backoff from NOTIFY_RETRY_BACKOFF_S, capped, then failed.
NOTIFY_MAX_RETRIES = env_int("NOTIFY_MAX_RETRIES", 6, minimum=0)
NOTIFY_RETRY_BACKOFF_S = env_int("NOTIFY_RETRY_BACKOFF_S", 30, minimum=1)
NOTIFY_RETRY_BACKOFF_MAX_S = env_int("NOTIFY_RETRY_BACKOFF_MAX_S", 600, minimum=1)
if NOTIFY_RETRY_BACKOFF_MAX_S >= CELERY_LONGEST_TASK_S * 2:  # a retry's countdown past it is redelivered early
    raise ConfigurationError("NOTIFY_RETRY_BACKOFF_MAX_S must stay far below the broker visibility timeout")
# A pool whose end is this close is announced once ("about to expire"); the sweep runs every interval.
NOTIFY_EXPIRY_WINDOW_H = env_int("NOTIFY_EXPIRY_WINDOW_H", 24, minimum=1)
NOTIFY_EXPIRY_INTERVAL_S = env_int("NOTIFY_EXPIRY_INTERVAL_S", 300, minimum=10)
# The operators' digest: one per period (hours), covering the events since the previous one.
NOTIFY_DIGEST_INTERVAL_H = env_int("NOTIFY_DIGEST_INTERVAL_H", 24, minimum=1)
# Pending deliveries whose message was lost are sent again after this long without an attempt.
NOTIFY_SWEEP_S = env_int("NOTIFY_SWEEP_S", 900, minimum=60)


# Static beat schedule; `expires` equals the period so a backlog never piles up.
CELERY_BEAT_SCHEDULE = {
    "discover-all-clusters": every(DISCOVERY_INTERVAL_S, "capacity.tasks.discover_all_task"),
    "capacity-reconcile-tier-labels": every(DISCOVERY_INTERVAL_S, "capacity.tasks.reconcile_all_tier_labels_task"),
    "capacity-sweep-reconfigurations": every(MIG_RECONFIG_SWEEP_S, "capacity.tasks.sweep_reconfigurations_task"),
    "operations-sweep-drains": every(MIG_RECONFIG_SWEEP_S, "operations.tasks.sweep_drains_task"),
    "operations-sweep-driver-upgrades": every(MIG_RECONFIG_SWEEP_S, "operations.tasks.sweep_driver_upgrades_task"),
    "pools-expire-requests": every(POOL_EXPIRY_INTERVAL_S, "pools.tasks.expire_requests_task"),
    "pools-sweep-provisioning": every(WORKFLOW_SWEEP_S, "pools.tasks.sweep_provisioning_task"),
    "pools-reconcile": every(POOL_RECONCILE_INTERVAL_S, "pools.tasks.reconcile_pools_task"),
    "pools-process-queue": every(QUEUE_PROCESS_INTERVAL_S, "pools.tasks.process_queue_task"),
    "pools-refresh-forecasts": every(QUEUE_FORECAST_INTERVAL_S, "pools.tasks.refresh_forecasts_task"),
    "pools-reconcile-loans": every(LENDING_RECONCILE_INTERVAL_S, "pools.tasks.reconcile_loans_task"),
    "pools-sweep-ending": every(ALLOCATION_ENDING_SWEEP_S, "pools.tasks.sweep_ending_task"),
    "monitoring-lend-idle": every(LENDING_INTERVAL_S, "monitoring.tasks.lend_idle_task"),
    "monitoring-poll-metrics": every(METRICS_INTERVAL_S, "monitoring.tasks.poll_metrics_task"),
    "monitoring-rollup": every(MONITORING_ROLLUP_INTERVAL_S, "monitoring.tasks.rollup_metrics_task"),
    "monitoring-retention": every(MONITORING_RETENTION_INTERVAL_S, "monitoring.tasks.prune_metrics_task"),
    "monitoring-idle-reservations": every(MONITORING_IDLE_INTERVAL_S, "monitoring.tasks.detect_idle_reservations_task"),
    # Billing: meter every complete hour (a no-op until one ends); close last month on the 1st.
    "billing-meter-usage": every(BILLING_METER_INTERVAL_S, "billing.tasks.meter_usage_task"),
    "billing-sweep": every(WORKFLOW_SWEEP_S, "billing.tasks.sweep_billing_task"),
    "notifications-pools-expiring": every(NOTIFY_EXPIRY_INTERVAL_S, "notifications.tasks.announce_expiring_task"),
    "notifications-digest": every(3600, "notifications.tasks.operator_digest_task"),
    "notifications-sweep": every(NOTIFY_SWEEP_S, "notifications.tasks.sweep_deliveries_task"),
    "billing-close-month": {
        "task": "billing.tasks.close_month_task",
        "schedule": crontab(minute=30, hour=0, day_of_month=1),
        "options": {"expires": 28 * 24 * 3600},
    },
}


# --- Beat: an active one and a standby (docs/reliability.md "Beat") ---------------------------
# With Redis (REDBEAT_REDIS_URL, else a Redis CELERY_BROKER_URL), celery-redbeat keeps each entry's last
# run in Redis and only the beat holding its lock sends; a second beat blocks on the lock, trying every
# loop interval, and takes over once the active one stops renewing it (SIGKILL, a lost node). Without
# Redis (the embedded default, `manage.py demo`): Celery's file scheduler and exactly one beat.
def beat_takeover(schedule: dict) -> tuple[int, int]:
    """(loop interval, lock timeout) in seconds, so that a standby sends within one shortest period.

    The active beat renews the lock to `lock` at every loop, at most `loop` apart; when it dies the lock
    has at most `lock` seconds left, and the standby tries every `loop`: it holds the lock within
    lock + loop = 5 * (shortest // 6) <= 5/6 of the shortest period (at least 5 s: loop is 1 s or more).
    The active one keeps 3 loops of margin before its lock would lapse under it.
    """
    periods = [int(e["schedule"].total_seconds()) for e in schedule.values() if isinstance(e["schedule"], timedelta)]
    loop = max(1, min(periods, default=60) // 6)
    return loop, 4 * loop


REDBEAT_REDIS_URL = env_str(
    "REDBEAT_REDIS_URL", _broker_url if _broker_url.startswith(("redis://", "rediss://")) else ""
)
if REDBEAT_REDIS_URL:
    if not REDBEAT_REDIS_URL.startswith(("redis://", "rediss://")):
        raise ConfigurationError(f"REDBEAT_REDIS_URL must be a redis:// or rediss:// URL, got {REDBEAT_REDIS_URL!r}")
    CELERY_BEAT_SCHEDULER = "redbeat.RedBeatScheduler"
    CELERY_BEAT_MAX_LOOP_INTERVAL, REDBEAT_LOCK_TIMEOUT = beat_takeover(CELERY_BEAT_SCHEDULE)
    # redbeat reads its REDBEAT_* names without the CELERY_ namespace (it checks the raw key names).
    # Options explicit, or redbeat falls back to the broker's transport options (deprecated in 2.4.2).
    REDBEAT_REDIS_OPTIONS: dict = {}

# --- Outside systems ------------------------------------------------------------------------
# Factory returning a pynvml-compatible library for (api_url, node_name). Production (DEBUG off):
# pynvml itself. With DEBUG=1 (demo, tests): the simulator's fake NVML (see simcluster/README.md).
NVML_LIBRARY = env_str(
    "NVML_LIBRARY", "simcluster.nvml.library_for_node" if DEBUG else "capacity.adapters.nvml.local_pynvml"
)
# The kubelet's PodResources socket the node agent asks which pod holds which device (docs/discovery.md
# "Which pod holds which device"). Production: the node's own socket, mounted read-only into the agent.
# With DEBUG=1 (demo, tests) the simulator serves one per node at this template ({api}: a digest of the
# cluster's API URL, {node}: the node name); a short path under the temporary directory, as a unix
# socket's path must stay under 108 bytes.
PODRESOURCES_SOCKET = env_str(
    "PODRESOURCES_SOCKET",
    str(Path(tempfile.gettempdir()) / "gpuaas-podres" / "{api}" / "{node}.sock")
    if DEBUG
    else "/var/lib/kubelet/pod-resources/kubelet.sock",
)
PODRESOURCES_TIMEOUT_S = env_int("PODRESOURCES_TIMEOUT_S", 10, minimum=1)
# Node agents (capacity/agent/, docs/security.md "Node agents"). The control plane derives every node's
# key from AGENT_SIGNING_SECRET (default: derived from SECRET_KEY); a node agent holds only its own node's
# key (AGENT_NODE_KEY, hex, from `manage.py agent-key CLUSTER NODE`) and signs for
# AGENT_CLUSTER_NAME/AGENT_NODE_NAME only. A simulated agent serving many nodes gets the secret instead.
AGENT_SIGNING_SECRET = (
    env_str("AGENT_SIGNING_SECRET", "") or hashlib.sha256(("gpuaas-agent-signing:" + SECRET_KEY).encode()).hexdigest()
)
AGENT_NODE_KEY = env_str("AGENT_NODE_KEY", "")
AGENT_CLUSTER_NAME = env_str("AGENT_CLUSTER_NAME", "")
AGENT_NODE_NAME = env_str("AGENT_NODE_NAME", "")
if AGENT_NODE_KEY:
    if not (AGENT_CLUSTER_NAME and AGENT_NODE_NAME):
        raise ConfigurationError("AGENT_NODE_KEY needs AGENT_CLUSTER_NAME and AGENT_NODE_NAME (the node it signs for)")
    try:
        if len(bytes.fromhex(AGENT_NODE_KEY)) != 32:
            raise ValueError
    except ValueError:
        raise ConfigurationError("AGENT_NODE_KEY must be 64 hex digits (`manage.py agent-key CLUSTER NODE`)") from None
if GPUAAS_ROLE == "node-agent" and not DEBUG and not (AGENT_NODE_KEY or env_str("AGENT_SIGNING_SECRET", "")):
    raise ConfigurationError("a node agent needs AGENT_NODE_KEY (its node's key: `manage.py agent-key CLUSTER NODE`)")
# The ingest worker (`manage.py ingest-worker`): reports per transaction, how long a partial batch
# waits for more, and when a killed ingest worker's unacknowledged batch is delivered again (Redis).
AGENT_INGEST_BATCH = env_int("AGENT_INGEST_BATCH", 500, minimum=1)
AGENT_INGEST_LINGER_MS = env_int("AGENT_INGEST_LINGER_MS", 1000, minimum=0)
AGENT_INGEST_VISIBILITY_S = env_int("AGENT_INGEST_VISIBILITY_S", 60, minimum=5)
KUBERNETES_TIMEOUT_S = env_int("KUBERNETES_TIMEOUT_S", 10, minimum=1)
KUBERNETES_RETRIES = env_int("KUBERNETES_RETRIES", 4, minimum=0)
KUBERNETES_PAGE_SIZE = env_int("KUBERNETES_PAGE_SIZE", 500, minimum=1)
# Fernet keys for stored cluster credentials: the first encrypts, all decrypt (rotation: put the new
# key first, run `manage.py rotate-credentials`, then drop the old one). CREDENTIALS_KEY is the
# one-key form. Required when DEBUG is off; with DEBUG=1 a key derived from SECRET_KEY is the default.
CREDENTIALS_KEYS = env_fernet_keys("CREDENTIALS_KEYS", "CREDENTIALS_KEY")
if not CREDENTIALS_KEYS:
    if not DEBUG and GPUAAS_ROLE != "node-agent":  # agents never read cluster credentials
        raise ConfigurationError(
            "CREDENTIALS_KEYS is required when DEBUG is off (Fernet keys, comma-separated, the first encrypts);"
            ' generate one with: python -c "from cryptography.fernet import Fernet;'
            ' print(Fernet.generate_key().decode())" (upgrading? see docs/security.md)'
        )
    CREDENTIALS_KEYS = [derived_credentials_key(SECRET_KEY)]

# --- Logging --------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"kubernetes": {"level": "WARNING"}, "urllib3": {"level": "WARNING"}},
}

# Personal API tokens live at most this many days (every token: API, admin, issue_token); 0: no limit.
# A token created by a request that authenticated with a token never outlives that token.
API_TOKEN_MAX_LIFETIME_DAYS = env_int("API_TOKEN_MAX_LIFETIME_DAYS", 365, minimum=0)
