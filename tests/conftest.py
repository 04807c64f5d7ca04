"""Shared fixtures: the personas (operator, project admin, member, outsider) and service markers."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from pathlib import Path

import pytest
from django.conf import settings

# The pools world (fleet, api, make_request, sim, kube_for): used by the pools and scheduling tests alike.
pytest_plugins = ["pool_world"]

REQUIRE_SERVICES = os.environ.get("GPUAAS_REQUIRE_SERVICES") == "1"
CLUSTER_ROLE = Path(__file__).resolve().parents[1] / "deploy" / "clusterrole.yaml"


class KubernetesRequestRecorder:
    """GPUAAS_RECORD_K8S_REQUESTS=path: every request gpuaas's adapter sends to any simulator in this
    session is recorded (simcluster.rbac.RECORDERS) and appended to `path` as JSON lines at the end,
    one per (verb, group, resource, subresource, namespaced) with the first test that made it. The
    session fails if the adapter used anything deploy/clusterrole.yaml does not grant; what the role
    grants and this run never used is only reported (a partial run cannot prove it unused:
    tests/deploy/test_rbac.py does, over one complete flow).

    Tests also call the adapter themselves to set a scene (delete a namespace to see it repaired):
    a request whose call stack holds no product module outside the adapter is sent with the User-Agent
    TEST_SET_UP and not recorded.
    """

    PRODUCT = ("capacity.", "pools.", "operations.", "monitoring.", "billing.", "gpuaas.", "benchmarks.")
    ADAPTER = "capacity.adapters.kubernetes"
    TEST_SET_UP = "gpuaas-test-set-up"

    def __init__(self, path: str):
        from capacity.adapters.kubernetes.transport import USER_AGENT

        self.user_agent = USER_AGENT
        self.path = Path(path)
        self.seen: dict[tuple, str] = {}
        self.test = ""
        self.lock = threading.Lock()

    def __call__(self, access, user_agent: str) -> None:
        if user_agent != self.user_agent:  # a test's own raw HTTP or set-up call, not the product
            return
        key = (access.verb, access.group, access.resource, access.subresource, access.namespaced)
        with self.lock:
            self.seen.setdefault(key, self.test)

    def from_product(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module.startswith(self.PRODUCT) and not module.startswith(self.ADAPTER):
                return True
            frame = frame.f_back
        return False

    def wrap_transport(self) -> None:
        from capacity.adapters.kubernetes.transport import Transport

        call, recorder = Transport._call, self

        @functools.wraps(call)
        def _call(transport, *args, **kwargs):
            if recorder.from_product():
                return call(transport, *args, **kwargs)
            transport.api_client.user_agent = recorder.TEST_SET_UP
            try:
                return call(transport, *args, **kwargs)
            finally:
                transport.api_client.user_agent = recorder.user_agent

        Transport._call = _call

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        self.test = item.nodeid

    def pytest_sessionfinish(self, session):
        from simcluster.rbac import Role, advice, compare

        fields = ("verb", "group", "resource", "subresource", "namespaced")
        with self.path.open("a") as out:
            for key, test in sorted(self.seen.items()):
                out.write(json.dumps({**dict(zip(fields, key, strict=True)), "test": test}) + "\n")
        role = Role.from_manifest(CLUSTER_ROLE)
        used = {(group, f"{res}/{sub}" if sub else res, verb) for verb, group, res, sub, _ in self.seen}
        missing, unused = compare(role, used)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            where = "deploy/clusterrole.yaml"
            reporter.write_line(f"Kubernetes requests: {len(used)} kinds recorded in {self.path}")
            if unused:
                reporter.write_line("granted, not used in this run:\n" + advice(set(), unused, where))
            if missing:
                reporter.write_line(advice(missing, set(), where), red=True)
        if missing:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config):
    from policies import values

    values.reset({})  # modules that build the schema at collection read the request cap: no database yet
    path = os.environ.get("GPUAAS_RECORD_K8S_REQUESTS")
    if path:
        from simcluster import rbac

        recorder = KubernetesRequestRecorder(path)
        recorder.wrap_transport()
        rbac.RECORDERS.append(recorder)
        config.pluginmanager.register(recorder, "gpuaas-k8s-recorder")


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


@pytest.fixture(autouse=True)
def _no_operator_policy():
    """Each test starts with no operator-set policy, as its fresh database does (and no query to learn it)."""
    from policies import values

    values.reset({})


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
