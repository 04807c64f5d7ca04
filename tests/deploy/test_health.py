"""The web Deployment's probes: /healthz never touches a service, /readyz checks the database and the broker."""

from __future__ import annotations

import socket

import pytest
from django.test import Client

from gpuaas.web import health

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_healthz_answers_without_checking_anything(monkeypatch):
    monkeypatch.setattr(health, "CHECKS", {"boom": lambda: (_ for _ in ()).throw(AssertionError("called"))})
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.postgres
@pytest.mark.redis
def test_readyz_ok_when_postgres_and_redis_answer():
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "migrations": "ok", "broker": "ok"}}


@pytest.mark.redis
def test_readyz_503_names_the_broker_when_it_is_down(settings):
    down = f"redis://127.0.0.1:{_closed_port()}/0"
    settings.CELERY_BROKER_URL = down
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("failed: ")


def test_readyz_503_names_the_database_when_it_fails(monkeypatch):
    monkeypatch.setattr(health, "CHECKS", {**health.CHECKS, "database": _raise_operational})
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "failed: OperationalError"


def _raise_operational():
    from django.db import OperationalError

    raise OperationalError("connection refused")


def test_probes_refuse_writes():
    assert Client().post("/readyz").status_code == 405


def test_readyz_503_until_every_migration_is_applied(monkeypatch):
    assert health.pending_migrations() == []
    monkeypatch.setattr(health, "_migrated", False)
    monkeypatch.setattr(health, "pending_migrations", lambda: ["capacity.0099_future"])
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"] == "failed: PendingMigrations"
