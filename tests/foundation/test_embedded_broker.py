"""The embedded broker (kombu's SQLAlchemy transport on SQLite) under concurrent producers and consumers."""

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from kombu import Connection

from gpuaas.management.commands.demo import purge_delivered_messages

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {"connect_args": {"timeout": 30}}  # what settings.py gives the embedded broker
PRODUCERS, CONSUMERS, MESSAGES = 3, 2, 300


def _produce(url, first, count):
    with Connection(url, transport_options=OPTIONS) as conn:
        queue = conn.SimpleQueue("soak")
        for i in range(first, first + count):
            queue.put({"i": i, "pad": "x" * 2000})  # big enough that a torn write would not decode
        queue.close()


def _consume(url, out):
    got, errors, idle = [], [], 0
    with Connection(url, transport_options=OPTIONS) as conn:
        queue = conn.SimpleQueue("soak")
        while idle < 4:
            try:
                message = queue.get(block=True, timeout=1)
            except queue.Empty:
                idle += 1
                continue
            except Exception as exc:  # noqa: BLE001 - counted and asserted on
                errors.append(repr(exc))
                continue
            idle = 0
            got.append(message.payload["i"])
            message.ack()
    Path(out).write_text(json.dumps({"got": got, "errors": errors}))


@pytest.mark.slow  # a soak: 5 processes, 900 messages through one SQLite file (34 s of a loaded 2-core run)
def test_every_message_is_delivered_exactly_once_to_concurrent_consumers(tmp_path):
    url = f"sqla+sqlite:///{tmp_path}/broker.sqlite3"
    with Connection(url, transport_options=OPTIONS) as conn:
        conn.SimpleQueue("soak").close()  # tables exist before the race starts
    ctx = multiprocessing.get_context("spawn")
    per = MESSAGES // PRODUCERS
    consumers = [ctx.Process(target=_consume, args=(url, tmp_path / f"c{k}.json")) for k in range(CONSUMERS)]
    producers = [ctx.Process(target=_produce, args=(url, k * per, per)) for k in range(PRODUCERS)]
    for proc in consumers + producers:
        proc.start()
    for proc in producers + consumers:
        proc.join(300)
        assert proc.exitcode == 0
    results = [json.loads((tmp_path / f"c{k}.json").read_text()) for k in range(CONSUMERS)]
    received = [i for r in results for i in r["got"]]
    assert [r["errors"] for r in results] == [[]] * CONSUMERS
    assert sorted(received) == list(range(MESSAGES))  # none lost, none twice


def test_purge_delivered_messages_deletes_only_taken_ones(tmp_path):
    url = f"sqla+sqlite:///{tmp_path}/broker.sqlite3"
    with Connection(url, transport_options=OPTIONS) as conn:
        queue = conn.SimpleQueue("q")
        for i in range(3):
            queue.put({"i": i})
        queue.get(timeout=5).ack()
        queue.close()
    assert purge_delivered_messages(url) == 1
    with sqlite3.connect(tmp_path / "broker.sqlite3") as db:
        assert db.execute("SELECT count(*), sum(visible) FROM kombu_message").fetchone() == (2, 2)
    assert purge_delivered_messages(url) == 0
    assert purge_delivered_messages("redis://127.0.0.1:6379/0") == 0
    assert purge_delivered_messages(f"sqla+sqlite:///{tmp_path}/absent.sqlite3") == 0
    assert not (tmp_path / "absent.sqlite3").exists()


def _settings_value(tmp_path, expr, **env):
    full = {k: v for k, v in os.environ.items() if k not in {"CELERY_BROKER_URL", "DATABASE_URL"}}
    full.update(GPUAAS_VAR_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); from django.conf import settings; print({expr})"],
        cwd=ROOT,
        env={**full, "DJANGO_SETTINGS_MODULE": "gpuaas.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_embedded_default_is_the_sqlite_broker_under_var(tmp_path):
    result = _settings_value(tmp_path, "settings.CELERY_BROKER_URL, settings.CELERY_BROKER_TRANSPORT_OPTIONS")
    assert result.stdout.strip() == (
        f"sqla+sqlite:///{tmp_path}/celery-broker.sqlite3 {{'connect_args': {{'timeout': 30}}}}"
    )


@pytest.mark.parametrize("url", ["filesystem://", "amqp://guest@localhost//", "sqla+postgresql://u@h/db"])
def test_other_brokers_are_refused_naming_the_variable(tmp_path, url):
    result = _settings_value(tmp_path, "settings.CELERY_BROKER_URL", CELERY_BROKER_URL=url)
    assert result.returncode != 0
    assert "CELERY_BROKER_URL must be redis://, rediss:// or sqla+sqlite:///PATH (embedded)" in result.stderr
    assert result.stdout == ""
