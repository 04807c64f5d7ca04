"""Strict environment parsing: a missing or malformed variable stops start-up with one line naming it."""

from __future__ import annotations

import base64
import hashlib
import os

import environ


class ConfigurationError(SystemExit):
    """Raised at import of settings; SystemExit so the process prints one line and stops."""

    def __init__(self, message: str):
        super().__init__(f"gpuaas configuration error: {message}")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ConfigurationError(f"{name}={value} must be at least {minimum}")
    return value


def env_str(name: str, default: str | None = None, *, required: bool = False) -> str:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        if required:
            raise ConfigurationError(f"{name} is required but not set")
        return default or ""
    return raw.strip()


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_database(name: str, default: str) -> dict:
    """Parse DATABASE_URL with django-environ; reject schemes we do not support."""
    raw = os.environ.get(name) or default
    try:
        config = environ.Env.db_url_config(raw)
    except Exception as exc:  # django-environ raises several types for junk
        raise ConfigurationError(f"{name}={raw!r} is not a database URL ({exc})") from None
    engine = config.get("ENGINE", "")
    if engine not in {"django.db.backends.sqlite3", "django.db.backends.postgresql"}:
        raise ConfigurationError(f"{name} must be a sqlite:// or postgres:// URL, got {raw!r}")
    return config


def env_cache(name: str, default: str) -> dict:
    """A CACHES entry from a URL: redis:// or rediss:// (Redis), file:///abs/dir, db://table_name.

    Per-process caches (locmem://) are refused: throttling state must be shared by every process.
    """
    raw = os.environ.get(name, "").strip() or default
    scheme, sep, rest = raw.partition("://")
    if scheme in {"redis", "rediss"} and sep:
        return {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": raw, "KEY_PREFIX": "gpuaas"}
    if scheme == "file" and rest.startswith("/"):
        return {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": rest}
    if scheme == "db" and rest.isidentifier():
        return {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": rest}
    raise ConfigurationError(
        f"{name}={raw!r} must be redis://host:port/db, rediss://..., file:///absolute/dir or db://table_name"
        " (a cache shared by every process)"
    )


def env_fernet_keys(name: str, single_name: str) -> list[str]:
    """Fernet keys from NAME (comma-separated) or SINGLE_NAME (one key); each is checked at start-up."""
    from cryptography.fernet import Fernet

    keys = env_list(name, []) or ([env_str(single_name)] if env_str(single_name) else [])
    used = name if os.environ.get(name, "").strip() else single_name
    for position, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ConfigurationError(
                f"{used}: key {position} is not a Fernet key (32 url-safe base64-encoded bytes); generate one with:"
                ' python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
            ) from None
    return keys


def derived_credentials_key(secret_key: str) -> str:
    """The Fernet key gpuaas derived from SECRET_KEY before CREDENTIALS_KEYS existed (DEBUG=1 only now)."""
    return base64.urlsafe_b64encode(hashlib.sha256(("gpuaas-credentials:" + secret_key).encode()).digest()).decode()
