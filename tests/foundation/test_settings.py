"""Settings errors stop start-up with one readable line naming the variable; the beat scheduler each setup gets."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "x7Gq2-p9LmZr4vT8wKc1NbYe6HsJd3UaQf5Wi0Ro_lXtMgVnEk2Ps"


def run_check(**env):
    # A clean environment (not the test suite's DEBUG=1): development (DEBUG=1) unless a case says otherwise.
    full = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "gpuaas.settings", "DEBUG": "1"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=full, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"DEBUG": "0"}, "SECRET_KEY is required"),
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"DEBUG": "0", "SECRET_KEY": "short"}, "SECRET_KEY must be at least 50 characters"),
        ({"DEBUG": "0", "SECRET_KEY": "x" * 60}, "ALLOWED_HOSTS is required"),
        ({"DATABASE_URL": "mysql://u@h/db"}, "DATABASE_URL must be a sqlite:// or postgres:// URL"),
        ({"CONN_MAX_AGE": "soon", "DATABASE_URL": "postgres://postgres@127.0.0.1/x"}, "CONN_MAX_AGE='soon'"),
        ({"CELERY_BROKER_URL": "amqp://guest@localhost//"}, "CELERY_BROKER_URL must be"),
        ({"REDBEAT_REDIS_URL": "sqla+sqlite:///beat.sqlite3"}, "REDBEAT_REDIS_URL must be a redis://"),
    ],
)
def test_bad_settings_stop_with_one_line(env, needle):
    result = run_check(**env)
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert lines == [lines[-1]], result.stderr
    assert lines[-1].startswith("gpuaas configuration error: ")
    assert needle in lines[-1]


def test_production_settings_pass_deploy_check_except_documented():
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "ERROR"],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
            "DJANGO_SETTINGS_MODULE": "gpuaas.settings",
            "CREDENTIALS_KEYS": "kH3p8m1hWq5Gq0nJ4bVbqkq1p6d8v6J8xgJ1T5cS3aE=",
            "SECRET_KEY": "x7Gq2-p9LmZr4vT8wKc1NbYe6HsJd3UaQf5Wi0Ro_lXtMgVn" + "Ek2Ps",
            "ALLOWED_HOSTS": "gpuaas.example.com",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    ids = {word.rstrip(":") for word in (result.stderr + result.stdout).split() if word.startswith("(security.")}
    # TLS is terminated at the ingress: README "Deploying" explains these two.
    assert ids <= {"(security.W004)", "(security.W008)"}, ids


def beat_settings(**env) -> dict:
    """The beat settings Celery sees in a fresh process with `env` (DeprecationWarnings are errors)."""
    full = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "gpuaas.settings", "DEBUG": "1", **env}
    script = (
        "import django, json; django.setup(); from core.celery import app; c = app.conf; print(json.dumps({"
        "'scheduler': c.beat_scheduler, 'loop': c.beat_max_loop_interval, 'url': c.get('REDBEAT_REDIS_URL'), "
        "'lock': c.get('REDBEAT_LOCK_TIMEOUT'), 'options': c.get('REDBEAT_REDIS_OPTIONS')}))"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", script],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_embedded_default_keeps_celerys_file_scheduler():
    assert beat_settings() == {
        "scheduler": "celery.beat:PersistentScheduler",
        "loop": 0,
        "url": "",
        "lock": None,
        "options": None,
    }


@pytest.mark.parametrize(
    "env",
    [
        {"CELERY_BROKER_URL": "redis://127.0.0.1:6379/6"},
        {"REDBEAT_REDIS_URL": "redis://127.0.0.1:6379/6"},  # the embedded broker, beat's schedule in Redis
    ],
)
def test_redis_selects_redbeat_with_a_lock_derived_from_the_shortest_period(env):
    # The shortest period is 30 s (WORKFLOW_SWEEP_S and others): loop 30 // 6, lock 4 loops.
    assert beat_settings(**env) == {
        "scheduler": "redbeat.RedBeatScheduler",
        "loop": 5,
        "url": "redis://127.0.0.1:6379/6",
        "lock": 20,
        "options": {},
    }
    shorter = beat_settings(**env, WORKFLOW_SWEEP_S="12")
    assert (shorter["loop"], shorter["lock"]) == (2, 8)
