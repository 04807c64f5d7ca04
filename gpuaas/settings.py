"""gpuaas settings: one env-driven file.

With no environment set, gpuaas runs embedded: SQLite under var/, kombu's filesystem broker
under var/, and the built-in simulated cluster. Set DATABASE_URL, CELERY_BROKER_URL and register
clusters with real kubeconfigs to run on PostgreSQL, Redis and real clusters. See README.md.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from .env import ConfigurationError, env_bool, env_database, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GPUAAS_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_str("SECRET_KEY", required=not DEBUG) or "gpuaas-insecure-development-key-set-SECRET_KEY-in-production"
if not DEBUG and len(SECRET_KEY) < 50:
    raise ConfigurationError("SECRET_KEY must be at least 50 characters when DEBUG is off")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    raise ConfigurationError("ALLOWED_HOSTS is required when DEBUG is off (comma-separated host names)")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
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
    "capacity",
    "pools",
    "billing",
    "monitoring",
    "gpuaas",
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
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASES = {"default": env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'gpuaas.sqlite3'}")}
IS_POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if IS_POSTGRES:
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("CONN_MAX_AGE", 60, minimum=0)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = env_bool("CONN_HEALTH_CHECKS", True)
else:
    # WAL and IMMEDIATE transactions let the demo's web server, worker and beat share one file.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth -----------------------------------------------------------------------------------
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
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
LOGIN_URL = "/admin/login/"

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
        "pools.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "gpuaas.api.Pagination",
    "PAGE_SIZE": env_int("API_PAGE_SIZE", 50, minimum=1),
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_THROTTLE_CLASSES": [
        "rest_framework.throttling.AnonRateThrottle",
        "rest_framework.throttling.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env_str("API_THROTTLE_ANON", "60/minute"),
        "user": env_str("API_THROTTLE_USER", "6000/minute"),
    },
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
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
}

# --- Cache (throttling state) ----------------------------------------------------------------
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.split("://")[0] not in {"filesystem", "redis", "rediss", "memory"}:
    raise ConfigurationError(
        f"CELERY_BROKER_URL must be filesystem://, redis:// or rediss://, got {CELERY_BROKER_URL!r}"
    )
CELERY_LONGEST_TASK_S = 30 * 60
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = VAR_DIR / "celery" / "queue"
    _queue_dir.mkdir(parents=True, exist_ok=True)
    (VAR_DIR / "celery" / "processed").mkdir(exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(VAR_DIR / "celery" / "processed"),
        "store_processed": False,
    }
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
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

DISCOVERY_INTERVAL_S = env_int("DISCOVERY_INTERVAL_S", 60, minimum=5)
METRICS_INTERVAL_S = env_int("METRICS_INTERVAL_S", 30, minimum=5)

# Static beat schedule; `expires` equals the period so a backlog never piles up.
CELERY_BEAT_SCHEDULE = {
    "discover-all-clusters": {
        "task": "capacity.tasks.discover_all_task",
        "schedule": timedelta(seconds=DISCOVERY_INTERVAL_S),
        "options": {"expires": DISCOVERY_INTERVAL_S},
    },
}

# --- Outside systems ------------------------------------------------------------------------
# Factory returning a pynvml-compatible library for (api_url, node_name). Real nodes: pynvml
# itself. The embedded default points at the simulator's fake NVML (see simcluster/README.md).
NVML_LIBRARY = env_str("NVML_LIBRARY", "simcluster.nvml.library_for_node")
KUBERNETES_TIMEOUT_S = env_int("KUBERNETES_TIMEOUT_S", 10, minimum=1)
KUBERNETES_RETRIES = env_int("KUBERNETES_RETRIES", 4, minimum=0)
KUBERNETES_PAGE_SIZE = env_int("KUBERNETES_PAGE_SIZE", 500, minimum=1)
# Key for encrypting stored cluster credentials (Fernet). Defaults to one derived from SECRET_KEY.
CREDENTIALS_KEY = env_str("CREDENTIALS_KEY", "")

# --- Logging --------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"kubernetes": {"level": "WARNING"}, "urllib3": {"level": "WARNING"}},
}
