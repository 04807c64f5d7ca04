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


def clear_shared_cache() -> None:
    """Empty the shared cache (API throttle counters). On Redis only gpuaas's keys: the broker may share the db."""
    from django.core.cache import cache

    if settings.CACHES["default"]["BACKEND"].endswith("RedisCache"):
        client = cache._cache.get_client(write=True)
        keys = list(client.scan_iter(match=f"{settings.CACHES['default']['KEY_PREFIX']}:*"))
        if keys:
            client.delete(*keys)
    else:
        cache.clear()


@pytest.fixture(autouse=True)
def _fresh_shared_cache():
    """Throttle counters live in a shared cache that outlives a test: each test starts without any."""
    clear_shared_cache()


@pytest.fixture
def operator(django_user_model):
    """Staff with model permissions: runs the platform."""
    return django_user_model.objects.create_superuser("operator", "operator@example.com", "pw-operator-1")


@pytest.fixture
def project(db):
    from tenancy.models import Project

    return Project.objects.create(name="Team A", slug="team-a", namespace="team-a")


@pytest.fixture
def other_project(db):
    from tenancy.models import Project

    return Project.objects.create(name="Team B", slug="team-b", namespace="team-b")


def _member(django_user_model, project, username, role):
    from tenancy.roles import set_role

    user = django_user_model.objects.create_user(username, f"{username}@example.com", f"pw-{username}-1")
    set_role(project, user, role)
    return user


@pytest.fixture
def alice(django_user_model, project):
    """Project admin of team-a."""
    return _member(django_user_model, project, "alice", "admin")


@pytest.fixture
def bob(django_user_model, project):
    """Member of team-a."""
    return _member(django_user_model, project, "bob", "member")


@pytest.fixture
def victor(django_user_model, project):
    """Viewer of team-a."""
    return _member(django_user_model, project, "victor", "viewer")


@pytest.fixture
def charlie(django_user_model, other_project):
    """Member of team-b only: an outsider to team-a, who must get 404s there."""
    return _member(django_user_model, other_project, "charlie", "member")


@pytest.fixture
def staff_nobody(django_user_model):
    """Staff (may log in to the admin) with no permissions and no project role: refused everything."""
    return django_user_model.objects.create_user("sam", "sam@example.com", "pw-sam-1", is_staff=True)


@pytest.fixture
def staff_operator(django_user_model):
    """Staff whose only grant is the Operators group: a real operator, not a superuser."""
    from tenancy.roles import operators_group

    user = django_user_model.objects.create_user("olga", "olga@example.com", "pw-olga-1", is_staff=True)
    user.groups.add(operators_group())
    return user
