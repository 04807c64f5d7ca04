"""The live OpenAPI schema against the app, in-process: schemathesis generates requests for every
operation from the schema drf-spectacular serves and checks each answer: never a 5xx, a documented
status code and content type, and a body that matches the documented schema.

Two personas, each with a real API token: the operator (sees and may change everything) and bob,
a member of team-a. Every example runs inside a transaction that is rolled back, so one operation's
writes (a revoked token, a deleted layout, an approved request) never leak into the next one; nothing
is enqueued either (on_commit never fires).

Derandomised, so the same code always gives the same result: each operation gets EXAMPLES examples
from Hypothesis seeded with SEED, after replaying the examples recorded in EXAMPLE_DATABASE (committed,
and read-only here: a run never rewrites it). The recorded examples are inputs that once broke an
operation (a project id of 20 digits gave a 500): they are tried on every run, whatever the seed.

The longer randomised run is `python manage.py bench schemathesis [--examples N] [--seed S]`, which
runs this test with the GPUAAS_SCHEMATHESIS_* variables below and prints the failures by kind and
persona. To record a new failing example into EXAMPLE_DATABASE on purpose (then commit it), run this
file with GPUAAS_SCHEMATHESIS_RECORD=1 and the seed that found it.

Detail operations are exercised both on ids the schema generates (mostly 404s) and on the id of a
real object of the small dashboard world, so serializers of real rows are checked too.
"""

from __future__ import annotations

import hashlib
import json
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
from hypothesis.database import DirectoryBasedExampleDatabase, ReadOnlyDatabase
from schemathesis.checks import not_a_server_error
from schemathesis.core import NotSet
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpuaas.env import env_bool, env_int, env_str

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboard"))
from dashboard_world import add_signals, build_world  # noqa: E402

pytestmark = pytest.mark.django_db

EXAMPLES = 10
SEED = 27
EXAMPLE_DATABASE = Path(__file__).resolve().parent / "schemathesis-examples"
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


def failure_kinds(exc: BaseException) -> list[str]:
    """The kinds of one operation's failure: schemathesis' check names (ServerError, JsonSchemaError...),
    or the exception's type for anything else; Hypothesis groups distinct failures."""
    if isinstance(exc, BaseExceptionGroup):
        return sorted({kind for inner in exc.exceptions for kind in failure_kinds(inner)})
    return [type(exc).__name__]


def example_database(record: bool, path: Path = EXAMPLE_DATABASE):
    """The committed example database; writable only when recording on purpose."""
    directory = DirectoryBasedExampleDatabase(path)
    return directory if record else ReadOnlyDatabase(directory)


def derandomised(test, *, strategy, examples: int, run_seed: int, database, key: str):
    """`test(case)` as a Hypothesis test: the examples recorded under `key` in `database` first, then
    `examples` generated from `run_seed`. Hypothesis' own `@seed` and `derandomize` switch the database
    off, so the seed and the key are set on the test directly; test_the_seed_and_the_recorded_examples_hold
    checks that both still take effect."""
    wrapped = given(case=strategy)(
        settings(
            max_examples=examples,
            database=database,
            deadline=None,
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )(test)
    )
    assert wrapped._hypothesis_internal_use_seed is None  # the attribute Hypothesis reads a seed from
    wrapped._hypothesis_internal_use_seed = run_seed
    # Keyed by the operation, whichever persona found an example and however `test` is written
    # (Hypothesis would key them by the function's source).
    wrapped._hypothesis_internal_database_key = key.encode()
    return wrapped


def test_the_seed_and_the_recorded_examples_hold(tmp_path):
    """The mechanism, on a plain strategy: a recorded failure is replayed first and never rewritten,
    and the same seed gives the same examples."""

    def run(record: bool, fails_above: int | None) -> list[int]:
        seen = []

        def test(case):
            seen.append(case)
            assert fails_above is None or case <= fails_above

        check = derandomised(
            test,
            strategy=st.integers(),
            examples=20,
            run_seed=SEED,
            database=example_database(record, tmp_path),
            key="mechanism",
        )
        try:
            check()
        except AssertionError:
            pass
        return seen

    failing = [case for case in run(record=True, fails_above=1000) if case > 1000]  # recorded
    recorded = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert failing and recorded

    replay = run(record=False, fails_above=None)
    assert replay[0] == failing[0]  # the recorded failure comes first, before anything generated
    assert run(record=False, fails_above=None) == replay  # the same seed, the same examples
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == recorded  # read-only


@pytest.mark.parametrize("persona", ["operator", "bob"])
def test_every_operation_answers_as_the_schema_says(request, persona, api_schema, ids):
    from django.db import connection

    from tenancy.models import ApiToken

    examples = env_int("GPUAAS_SCHEMATHESIS_EXAMPLES", EXAMPLES, minimum=1)
    run_seed = env_int("GPUAAS_SCHEMATHESIS_SEED", SEED)
    database = example_database(record=env_bool("GPUAAS_SCHEMATHESIS_RECORD", False))
    report = env_str("GPUAAS_SCHEMATHESIS_REPORT")

    user = request.getfixturevalue(persona)
    token, key = ApiToken.issue(user, "schemathesis", timezone.now() + timedelta(days=1))
    headers = {"Authorization": f"Bearer {key}"}
    failures: dict[str, list[str]] = {}
    messages = []
    cases = hashlib.sha256()  # every request sent, in order: two runs that agree sent the same ones
    sent = 0
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 50

    for operation in operations:

        def check(case):
            nonlocal sent
            sent += 1
            body = None if isinstance(case.body, NotSet) else case.body
            sent_case = [case.method, case.path, case.path_parameters, case.query, body]
            cases.update(json.dumps(sent_case, default=repr, sort_keys=True).encode())
            with transaction.atomic():
                try:
                    case.call_and_validate(headers=headers, checks=CHECKS)
                finally:
                    transaction.set_rollback(True)

        check = derandomised(
            check,
            strategy=_strategy(operation, ids, token.pk),
            examples=examples,
            run_seed=run_seed,
            database=database,
            key=f"gpuaas-schemathesis {operation.label}",
        )

        try:
            check()
        except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure, then report them all
            failures[operation.label] = failure_kinds(exc)
            messages.append(f"{operation.label}: {exc}")

    if report:
        line = {
            "persona": persona,
            "database": connection.vendor,
            "examples": examples,
            "seed": run_seed,
            "operations": len(operations),
            "cases": sent,
            "cases_sha256": cases.hexdigest(),
            "failures": failures,
        }
        with open(report, "a") as out:
            out.write(json.dumps(line) + "\n")
    assert not messages, f"{len(messages)} operations failed:\n\n" + "\n\n".join(messages)
