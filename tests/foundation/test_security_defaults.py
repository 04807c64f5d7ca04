"""Production defaults are safe: settings loaded in a clean environment (no test-suite DEBUG=1)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "x7Gq2-p9LmZr4vT8wKc1NbYe6HsJd3UaQf5Wi0Ro_lXtMgVnEk2Ps"
KEY = "kH3p8m1hWq5Gq0nJ4bVbqkq1p6d8v6J8xgJ1T5cS3aE="
PRODUCTION = {"SECRET_KEY": SECRET, "ALLOWED_HOSTS": "gpuaas.example.com", "CREDENTIALS_KEYS": KEY}
PRINT = (
    "import django, json; django.setup(); from django.conf import settings as s;"
    "print(json.dumps({'DEBUG': s.DEBUG, 'SECRET_KEY': s.SECRET_KEY, 'NVML_LIBRARY': s.NVML_LIBRARY,"
    " 'CREDENTIALS_KEYS': s.CREDENTIALS_KEYS, 'CACHE': s.CACHES['default']}))"
)


def load(tmp_path, **env):
    """gpuaas.settings in a fresh interpreter whose environment holds only PATH, a var/ dir and env."""
    full = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "gpuaas.settings",
        "GPUAAS_VAR_DIR": str(tmp_path / "var"),
        **env,
    }
    return subprocess.run([sys.executable, "-c", PRINT], cwd=ROOT, env=full, capture_output=True, text=True, timeout=60)


def loaded(tmp_path, **env) -> dict:
    result = load(tmp_path, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def refused(tmp_path, **env) -> str:
    result = load(tmp_path, **env)
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpuaas configuration error: "), result.stderr
    return lines[0]


def test_no_environment_is_production_and_asks_for_a_secret_key(tmp_path):
    line = refused(tmp_path)
    assert "SECRET_KEY is required when DEBUG is off" in line
    assert "secrets.token_urlsafe(50)" in line


def test_production_defaults_debug_off_real_nvml_shared_cache(tmp_path):
    got = loaded(tmp_path, **PRODUCTION)
    assert got["DEBUG"] is False
    assert got["NVML_LIBRARY"] == "capacity.adapters.nvml.local_pynvml"
    assert got["CREDENTIALS_KEYS"] == [KEY]
    assert got["CACHE"] == {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(tmp_path / "var" / "cache"),
    }


def test_debug_on_gets_the_development_fallbacks(tmp_path):
    got = loaded(tmp_path, DEBUG="1")
    assert got["DEBUG"] is True
    assert got["SECRET_KEY"] == "gpuaas-insecure-development-key-set-SECRET_KEY-in-production"
    assert got["NVML_LIBRARY"] == "simcluster.nvml.library_for_node"
    assert len(got["CREDENTIALS_KEYS"]) == 1  # derived from SECRET_KEY: development only


def test_public_development_key_refused_without_debug(tmp_path):
    line = refused(
        tmp_path, **{**PRODUCTION, "SECRET_KEY": "gpuaas-insecure-development-key-set-SECRET_KEY-in-production"}
    )
    assert "SECRET_KEY is the public development key" in line


def test_credentials_keys_required_without_debug(tmp_path):
    line = refused(tmp_path, SECRET_KEY=SECRET, ALLOWED_HOSTS="gpuaas.example.com")
    assert "CREDENTIALS_KEYS is required when DEBUG is off" in line
    assert "Fernet.generate_key()" in line


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"CREDENTIALS_KEYS": f"{KEY},not-a-key"}, "CREDENTIALS_KEYS: key 2 is not a Fernet key"),
        ({"CREDENTIALS_KEYS": "", "CREDENTIALS_KEY": "short"}, "CREDENTIALS_KEY: key 1 is not a Fernet key"),
        ({"CACHE_URL": "locmem://"}, "CACHE_URL='locmem://' must be redis://"),
        ({"CACHE_URL": "file://relative/dir"}, "CACHE_URL='file://relative/dir' must be"),
    ],
)
def test_bad_security_settings_stop_with_one_line(tmp_path, env, needle):
    assert needle in refused(tmp_path, **{**PRODUCTION, **env})


def test_credentials_key_is_the_one_key_form_and_keys_keep_their_order(tmp_path):
    other = "3q2-7wEjHc9bR0kYt8a1Vn5sLm4pXz6uQf2Dg0HiJkE="
    assert loaded(tmp_path, **{**PRODUCTION, "CREDENTIALS_KEYS": "", "CREDENTIALS_KEY": KEY})["CREDENTIALS_KEYS"] == [
        KEY
    ]
    assert loaded(tmp_path, **{**PRODUCTION, "CREDENTIALS_KEYS": f"{other}, {KEY}"})["CREDENTIALS_KEYS"] == [
        other,
        KEY,
    ]


@pytest.mark.parametrize(
    ("env", "location"),
    [
        ({"CACHE_URL": "redis://cache.internal:6379/2"}, "redis://cache.internal:6379/2"),
        ({"REDIS_URL": "redis://r:6379/3"}, "redis://r:6379/3"),
        ({"CELERY_BROKER_URL": "redis://broker:6379/0"}, "redis://broker:6379/0"),
        ({"CACHE_URL": "redis://c:6379/1", "CELERY_BROKER_URL": "redis://broker:6379/0"}, "redis://c:6379/1"),
    ],
)
def test_redis_cache_when_redis_is_configured(tmp_path, env, location):
    assert loaded(tmp_path, **{**PRODUCTION, **env})["CACHE"] == {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": location,
        "KEY_PREFIX": "gpuaas",
    }


def test_nvml_library_can_still_be_chosen(tmp_path):
    got = loaded(tmp_path, **{**PRODUCTION, "NVML_LIBRARY": "simcluster.nvml.library_for_node"})
    assert got["NVML_LIBRARY"] == "simcluster.nvml.library_for_node"
