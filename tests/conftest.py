"""Shared fixtures: the personas (operator, project admin, member, outsider) and service markers."""

from __future__ import annotations

import os

import pytest
from django.conf import settings

REQUIRE_SERVICES = os.environ.get("GPUAAS_REQUIRE_SERVICES") == "1"


def pytest_collection_modifyitems(config, items):
    """Skip postgres/redis tests on the embedded default, but never in CI (GPUAAS_REQUIRE_SERVICES=1)."""
    is_pg = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    is_redis = settings.CELERY_BROKER_URL.startswith("redis")
    for item in items:
        if "postgres" in item.keywords and not is_pg:
            if REQUIRE_SERVICES:
                raise pytest.UsageError("GPUAAS_REQUIRE_SERVICES=1 but DATABASE_URL is not PostgreSQL")
            item.add_marker(pytest.mark.skip(reason="needs DATABASE_URL=postgres://..."))
        if "redis" in item.keywords and not is_redis:
            if REQUIRE_SERVICES:
                raise pytest.UsageError("GPUAAS_REQUIRE_SERVICES=1 but CELERY_BROKER_URL is not Redis")
            item.add_marker(pytest.mark.skip(reason="needs CELERY_BROKER_URL=redis://..."))


@pytest.fixture
def operator(django_user_model):
    """Staff with model permissions: runs the platform."""
    return django_user_model.objects.create_superuser("operator", "operator@example.com", "pw-operator-1")
