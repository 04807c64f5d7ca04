"""The settings every process needs: paths, keys, apps, database, sign-in, static files, security, cache."""

from __future__ import annotations

import tomllib
from datetime import timedelta
from pathlib import Path

from .env import (
    ConfigurationError,
    env_bool,
    env_cache,
    env_database,
    env_int,
    env_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent
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
    "policies",
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
    "gpuaas.web.middleware.UnsupportedMethodMiddleware",  # TRACE and unknown methods: 405 before any view
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
AXES_RESET_ON_SUCCESS = True  # forgives the signed-in username's failures only (gpuaas.web.access.LockoutHandler)
# Failures live in the database: shared by every web process and host, listed in the admin
# (Axes > Access attempts, with an "Unlock" action), and `manage.py axes_reset` clears them all.
AXES_HANDLER = "gpuaas.web.access.LockoutHandler"
AXES_LOCKOUT_TEMPLATE = "registration/lockout.html"
AXES_VERBOSE = False  # no banner at every start; lockouts are still logged as warnings
# The client address is REMOTE_ADDR unless TRUSTED_PROXY_COUNT proxies (the ingress) append to
# X-Forwarded-For; django-ipware reads it (gpuaas.web.access.client_address), for axes and the API
# throttles alike: a forged header must not give an attacker a fresh address per attempt.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0, minimum=0)
AXES_CLIENT_IP_CALLABLE = "gpuaas.web.access.client_address"

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
