"""Probes for the web Deployment: /healthz (liveness, touches nothing) and /readyz (database, schema, broker).

Liveness must not depend on PostgreSQL or Redis: an outage of either would otherwise make the kubelet
restart every web pod at once, which cures nothing. Readiness takes a pod out of the Service while it
cannot serve; the broker check has a short timeout, and the kubelet's probe timeout bounds the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from core.celery import app as celery_app
from core.scopes import Scope, scoped

logger = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 2.0


def check_database() -> None:
    """One round trip on the default connection (the probe's own timeout bounds a hung server)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def check_broker() -> None:
    """Connect to the Celery broker once, no retries (kombu raises on failure)."""
    with celery_app.connection_for_write(settings.CELERY_BROKER_URL) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=BROKER_TIMEOUT_S)
        if settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
            conn.default_channel.client.ping()  # the transport connects lazily: make it talk


class PendingMigrations(Exception):
    """The database schema is older than this code: the migration Job has not finished."""


_migrated = False


def check_migrations() -> None:
    """Every migration this code ships is applied. Once true, it stays true for this process's code,
    so the migration graph is read until then only. A pod of a new release therefore becomes ready
    only after the migration Job has run (docs/deploying.md "Upgrading")."""
    global _migrated
    if _migrated:
        return
    pending = pending_migrations()
    if pending:
        raise PendingMigrations(f"{len(pending)} migration(s) not applied, first {pending[0]}")
    _migrated = True


def pending_migrations() -> list[str]:
    """The migrations this code ships that the database lacks, in the order migrate would apply them."""
    executor = MigrationExecutor(connection)
    return [str(migration) for migration, _ in executor.migration_plan(executor.loader.graph.leaf_nodes())]


CHECKS: dict[str, Callable[[], None]] = {
    "database": check_database,
    "migrations": check_migrations,
    "broker": check_broker,
}


def readiness() -> tuple[bool, dict[str, str]]:
    """Run every check; ({name: "ok" | "failed: <error class>"}, all passed)."""
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        started = time.monotonic()
        try:
            check()
        except Exception as exc:  # any failure of the outside system means "not ready", never a 500
            logger.warning("readiness: %s check failed after %.2f s: %s", name, time.monotonic() - started, exc)
            results[name] = f"failed: {type(exc).__name__}"
        else:
            results[name] = "ok"
    return all(value == "ok" for value in results.values()), results


@scoped(Scope.PUBLIC)
@never_cache
@require_GET
def healthz(request):
    """Liveness: the process answers HTTP. Nothing else is checked (see the module docstring)."""
    return JsonResponse({"status": "ok"})


@scoped(Scope.PUBLIC)
@never_cache
@require_GET
def readyz(request):
    """Readiness: 200 when the database answers with this code's schema and the broker answers, else 503
    naming the failed checks.

    Only the error class is returned (the probe is public); the full error goes to the log.
    """
    ok, checks = readiness()
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)
