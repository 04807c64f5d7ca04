"""The live OpenAPI schema against the app, in-process: schemathesis generates requests for every
operation from the schema drf-spectacular serves and checks each answer: never a 5xx, a documented
status code and content type, and a body that matches the documented schema.

Two personas, each with a real API token: the operator (sees and may change everything) and bob,
a member of team-a. Each operation gets a bounded number of examples, derandomized (the same
requests every run) and without Hypothesis' example database. Every example runs inside a
transaction that is rolled back, so one operation's writes (a revoked token, a deleted layout, an
approved request) never leak into the next one; nothing is enqueued either (on_commit never fires).

Detail operations are exercised both on ids the schema generates (mostly 404s) and on the id of a
real object of the small dashboard world, so serializers of real rows are checked too.
"""

from __future__ import annotations

import sys
from datetime import time, timedelta
from pathlib import Path

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboard"))
from dashboard_world import add_signals, build_world  # noqa: E402

pytestmark = pytest.mark.django_db

EXAMPLES = 10
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
PREFIX = "/api/v1/"


@pytest.fixture
def wsgi_app(settings):
    """Django's WSGI application, sharing the test's database connection: the handler's
    close_old_connections would otherwise close it between requests (as Django's test client avoids)."""
    from django.core.wsgi import get_wsgi_application

    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def ids(project, other_project, operator, bob) -> dict[str, int]:
    """One real object per API resource (by the path after /api/v1/), for detail operations."""
    from billing import services as billing_services
    from billing.models import BillingRun, RateCard, UsageRecord
    from capacity.models import DiscoveryRun, MaintenanceWindow, MigLayout, SpecAndCount, TimeSlicingPolicy
    from monitoring.models import HealthEvent, IdleReservation, Series
    from pools.models import Allocation, BestEffortRequest

    world = build_world(project, other_project)
    add_signals(world)
    statement = billing_services.generate_statement(project, timezone.now().date().replace(day=1))
    run = BillingRun.objects.create(kind="close", period=statement.period)
    discovery = DiscoveryRun.objects.create(cluster=world.alpha)
    layout = MigLayout.objects.create(name="halves", product="H100-80GB", gpus={"all": ["3g.40gb", "3g.40gb"]})
    window = MaintenanceWindow.objects.create(
        cluster=world.alpha, name="sunday", weekday=6, start_time=time(2), end_time=time(4)
    )
    policy = TimeSlicingPolicy.objects.create(cluster=world.beta, node_group="shared", replicas=4)
    team_a_series = Series.objects.filter(mig_instance=world.instances["a1-0-3g@0"]).first()
    values = {
        "projects": project.pk,
        "pool-requests": world.pending.pk,
        "best-effort-requests": BestEffortRequest.objects.create(project=project, product="H100-80GB").pk,
        "pools": world.pools["inference"].pk,
        "allocations": Allocation.objects.filter(project=project).order_by("pk").first().pk,
        "billing/rate-cards": getattr(RateCard.objects.order_by("pk").first(), "pk", None),
        "billing/usage": getattr(UsageRecord.objects.filter(project=project).first(), "pk", None),
        "billing/statements": statement.pk,
        "billing/runs": run.pk,
        "monitoring/series": team_a_series.pk,
        "monitoring/pools": world.pools["inference"].pk,
        "monitoring/health-events": HealthEvent.objects.order_by("pk").first().pk,
        "monitoring/idle-reservations": getattr(IdleReservation.objects.first(), "pk", None),
        "capacity/clusters": world.alpha.pk,
        "capacity/nodes": world.gpus["a1-0"].node_id,
        "capacity/gpus": world.gpus["a1-0"].pk,
        "capacity/specs": getattr(SpecAndCount.objects.first(), "pk", None),
        "capacity/discovery-runs": discovery.pk,
        "mig-layouts": layout.pk,
        "maintenance-windows": window.pk,
        "time-slicing-policies": policy.pk,
        "user_id": bob.pk,
    }
    return {key: value for key, value in values.items() if value is not None}


@pytest.fixture
def api_schema(wsgi_app, db):
    return schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app)


def _resource(path: str) -> str:
    return path.removeprefix(PREFIX).split("/{", 1)[0]


def _strategy(operation, ids: dict[str, int], token_id: int):
    names = {p.name for p in operation.path_parameters}
    if not names:
        return operation.as_strategy()
    known = {}
    if "id" in names:
        resource = _resource(operation.path)
        value = token_id if resource == "tokens" else ids.get(resource)
        if value is not None:
            known["id"] = value
    if "user_id" in names:
        known["user_id"] = ids["user_id"]
    if not known:
        return operation.as_strategy()
    return st.one_of(operation.as_strategy(path_parameters=known), operation.as_strategy())


@pytest.mark.parametrize("persona", ["operator", "bob"])
def test_every_operation_answers_as_the_schema_says(request, persona, api_schema, ids):
    from tenancy.models import ApiToken

    user = request.getfixturevalue(persona)
    token, key = ApiToken.issue(user, "schemathesis", timezone.now() + timedelta(days=1))
    headers = {"Authorization": f"Bearer {key}"}
    failures = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 50

    for operation in operations:

        @given(case=_strategy(operation, ids, token.pk))
        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case):
            with transaction.atomic():
                try:
                    case.call_and_validate(headers=headers, checks=CHECKS)
                finally:
                    transaction.set_rollback(True)

        try:
            check()
        except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure, then report them all
            failures.append(f"{operation.label}: {exc}")

    assert not failures, f"{len(failures)} operations failed:\n\n" + "\n\n".join(failures)
