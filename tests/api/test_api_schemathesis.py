"""The live OpenAPI schema against the app, in-process: schemathesis generates requests for every
operation from the schema drf-spectacular serves, valid ones and invalid ones, and runs every check it
has on each answer (CHECKS): never a 5xx; a documented status code, content type and headers; a body
that matches the documented schema; schema-invalid input refused and schema-valid input accepted (but
the refusals DOMAIN_REFUSALS documents); authentication enforced where the schema says so.

Three personas: the operator (sees and may change everything) and bob, a member of team-a, each with a
real API token, and an anonymous client. Every example runs inside a transaction that is rolled back,
so one operation's writes (a revoked token, a deleted layout, an approved request) never leak into the
next one; nothing is enqueued either (on_commit never fires).

Derandomised, so the same code always gives the same result: each operation gets EXAMPLES examples
from Hypothesis seeded with SEED, after replaying the examples recorded in EXAMPLE_DATABASE (committed,
and read-only here: a run never rewrites it). The recorded examples are inputs that once broke an
operation (a project id of 20 digits gave a 500): they are tried on every run, whatever the seed.

The longer randomised run is `python manage.py bench schemathesis [--examples N] [--seed S]`, which
runs this test with the GPUAAS_SCHEMATHESIS_* variables below (with --coverage, schemathesis' coverage
phase too: GPUAAS_SCHEMATHESIS_COVERAGE=1, about 6,000 fixed cases per persona), and prints the
failures by kind and persona. To record a new failing example into EXAMPLE_DATABASE on purpose (then
commit it), run this file with GPUAAS_SCHEMATHESIS_RECORD=1 and the seed that found it.

Detail operations are exercised both on ids the schema generates (mostly 404s) and on the id of a
real object of the small dashboard world, so serializers of real rows are checked too.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from datetime import time, timedelta
from pathlib import Path

import pytest
import schemathesis
import schemathesis.specs.openapi.checks  # noqa: F401  (registers the OpenAPI checks)
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ReadOnlyDatabase
from schemathesis.checks import CHECKS as REGISTERED_CHECKS
from schemathesis.core import NotSet
from schemathesis.generation import GenerationMode
from schemathesis.generation.drivers import CoverageGenerator
from schemathesis.generation.feedback import NO_FEEDBACK
from schemathesis.generation.overrides import Override
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance

from gpuaas.settings.env import env_bool, env_int, env_list, env_str

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboard"))
from dashboard_world import add_signals, build_world  # noqa: E402

pytestmark = pytest.mark.django_db

EXAMPLES = 10
SEED = 27
EXAMPLE_DATABASE = Path(__file__).resolve().parent / "schemathesis-examples"
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
PERSONAS = ["operator", "bob", "anonymous"]

# Schema-valid requests an operation refuses for a reason no OpenAPI schema can state: an id or a name
# that names no object, or the state of the world. positive_data_acceptance takes a 400 from these
# operations only when it names nothing but these fields (any other field refused is still a failure).
# docs/benchmarks.md lists them with the same reasons.
NAMES_NO_OBJECT = "an id (or slug, username) that names no object, or none the caller may use"
AHEAD = "a time that must lie ahead, or an end after its start: a date-time schema cannot say 'after now'"
FRACTION = "compute_fraction from 0.001 to 1: OpenAPI 3.0 cannot bound a decimal written as a string"
DOMAIN_REFUSALS: list[tuple[str, set[str], str]] = [
    ("POST /api/v1/best-effort-requests/", {"project", "cluster"}, NAMES_NO_OBJECT),
    ("POST /api/v1/best-effort-requests/", {"until"}, AHEAD),
    ("POST /api/v1/pool-requests/", {"project", "cluster"}, NAMES_NO_OBJECT),
    ("POST /api/v1/pool-requests/", {"start_at", "end_at"}, AHEAD),
    ("POST /api/v1/pool-requests/", {"compute_fraction"}, FRACTION),
    ("POST /api/v1/pool-requests/forecast/", {"project", "cluster"}, NAMES_NO_OBJECT),
    ("POST /api/v1/pool-requests/forecast/", {"start_at", "end_at"}, AHEAD),
    ("POST /api/v1/pool-requests/forecast/", {"compute_fraction"}, FRACTION),
    ("POST /api/v1/pool-requests/dry-run/", {"cluster"}, NAMES_NO_OBJECT),
    ("POST /api/v1/pool-requests/dry-run/", {"start_at", "end_at"}, AHEAD),
    ("POST /api/v1/pool-requests/dry-run/", {"compute_fraction"}, FRACTION),
    *[
        (f"POST /api/v1/pool-requests/{path}", {"vgpu_type"}, "a vGPU type the cluster's vGPU nodes offer")
        for path in ["", "forecast/", "dry-run/"]
    ],
    *[
        (f"{method} /api/v1/{path}", {"projects"}, NAMES_NO_OBJECT)
        for method, path in [
            ("POST", "auto-approval-policies/"),
            ("PUT", "auto-approval-policies/{id}/"),
            ("PATCH", "auto-approval-policies/{id}/"),
        ]
    ],
    *[
        (
            f"{method} /api/v1/maintenance-windows/{path}",
            {"non_field_errors", "weekday", "end_time", "ends_at"},
            "a weekly window (weekday, start and end together, not empty) or a one-off one (end after start)",
        )
        for method, path in [("POST", ""), ("PUT", "{id}/"), ("PATCH", "{id}/")]
    ],
    *[
        (f"{method} /api/v1/{path}", fields, NAMES_NO_OBJECT)
        for method, fields, path in [
            ("POST", {"node"}, "capacity/tier-assignments/"),
            ("PUT", {"node"}, "capacity/tier-assignments/{id}/"),
            ("PATCH", {"node"}, "capacity/tier-assignments/{id}/"),
            ("POST", {"cluster"}, "maintenance-windows/"),
            ("PUT", {"cluster"}, "maintenance-windows/{id}/"),
            ("PATCH", {"cluster"}, "maintenance-windows/{id}/"),
            ("GET", {"cluster"}, "maintenance-windows/"),
            ("POST", {"cluster"}, "time-slicing-policies/"),
            ("PUT", {"cluster"}, "time-slicing-policies/{id}/"),
            ("PATCH", {"cluster"}, "time-slicing-policies/{id}/"),
            ("GET", {"cluster"}, "time-slicing-policies/"),
            ("POST", {"node", "layout"}, "mig-reconfigurations/"),
            ("GET", {"cluster", "node"}, "mig-reconfigurations/"),
            ("GET", {"cluster"}, "rebalance/"),
            ("GET", {"cluster"}, "capacity-plan/"),
            ("POST", {"node"}, "node-drains/"),
            ("GET", {"cluster", "node"}, "node-drains/"),
            ("POST", {"project"}, "billing/statements/generate/"),
            ("POST", {"username"}, "projects/{id}/members/"),
            ("POST", {"nodes", "gpus"}, "take-offline/"),
            ("POST", {"cluster"}, "pool-requests/{id}/approve/"),
            ("POST", {"cluster"}, "pool-requests/{id}/move/"),
        ]
    ],
    ("POST /api/v1/take-offline/", {"non_field_errors"}, "nodes or gpus: at least one of the two lists"),
    (
        "POST /api/v1/capacity/nodes/{id}/vgpu-config/",
        {"node", "vgpu_type"},
        "a node in vm-vgpu mode, a type its GPUs offer, and no vGPU of it in use: the state of the node",
    ),
    (
        "POST /api/v1/pools/{id}/share-priority/",
        {"share_priority"},
        "only time-sliced and MPS pools have a share priority: the kind of the pool",
    ),
    (
        "GET /api/v1/procurement/what-if/",
        {"profile", "add"},
        "a MIG tier needs a profile of the product, other tiers none; each GPU count once",
    ),
    (
        "GET /api/v1/capacity-plan/",
        {"product", "layout"},
        "a proposal needs product and gpus, and a layout of the product's MIG profiles",
    ),
    *[
        (f"{method} /api/v1/capacity/tier-policies/{path}", {"tier"}, "one policy per tier: a second is refused")
        for method, path in [("POST", ""), ("PUT", "{id}/"), ("PATCH", "{id}/")]
    ],
    ("POST /api/v1/billing/statements/{id}/finalise/", {"period"}, "a month is finalised only once it has ended"),
    ("POST /api/v1/billing/runs/", {"period"}, "a month is closed only once it has ended"),
    ("POST /api/v1/billing/statements/{id}/adjust/", {"amount"}, "an adjustment of zero changes nothing"),
    (
        "POST /api/v1/tokens/",
        {"expires_at", "expires_in_days"},
        "one of expires_at and expires_in_days, and a token minted with a token never outlives it",
    ),
    *[
        (f"{method} /api/v1/auto-approval-policies/{path}", {"window_start", "window_end"}, "both ends or neither")
        for method, path in [("POST", ""), ("PUT", "{id}/"), ("PATCH", "{id}/")]
    ],
    *[
        (f"{method} /api/v1/mig-layouts/{path}", {"gpus"}, "a layout's MIG profiles must fit its product's GPU")
        for method, path in [("POST", ""), ("PUT", "{id}/"), ("PATCH", "{id}/")]
    ],
    (
        "POST /api/v1/mig-reconfigurations/",
        {"per_gpu", "named"},
        "a layout's MIG profiles (and a named mig-parted config) must fit the node's GPUs",
    ),
    (
        "POST /api/v1/mig-reconfigurations/",
        {"non_field_errors"},
        "exactly one of layout, named and per_gpu (null and empty count as not given), for a node whose GPUs"
        " gpuaas knows and that can take it: a cross-field rule and the state of the world",
    ),
    ("POST /api/v1/driver-upgrades/", {"cluster", "nodes"}, NAMES_NO_OBJECT),
    ("GET /api/v1/driver-upgrades/", {"cluster"}, NAMES_NO_OBJECT),
    ("POST /api/v1/driver-upgrades/{id}/give-back/", {"node"}, NAMES_NO_OBJECT),
    (
        "POST /api/v1/driver-upgrades/",
        {"nodes", "node_group", "cluster"},
        "nodes of the cluster, not in another open rollout, or a node group (or cluster) with GPU nodes:"
        " the state of the fleet",
    ),
    *[
        (f"GET /api/v1/{path}", {"start", "end"}, "a time range: start before end, at most the range a read allows")
        for path in ["monitoring/pools/", "monitoring/pools/{id}/", "monitoring/series/{id}/samples/"]
    ],
]
REFUSABLE_FIELDS: dict[str, set[str]] = {}
for _label, _fields, _reason in DOMAIN_REFUSALS:
    REFUSABLE_FIELDS.setdefault(_label, set()).update(_fields)


def refused_for_a_domain_reason(label: str, response) -> bool:
    """A 400 from an operation of DOMAIN_REFUSALS naming only the fields it lists."""
    if response.status_code != 400 or label not in REFUSABLE_FIELDS:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and bool(body) and set(body) <= REFUSABLE_FIELDS[label]


def positive_data_acceptance_but_domain_refusals(ctx, response, case):
    """schemathesis' positive_data_acceptance, except for the refusals DOMAIN_REFUSALS documents."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if refused_for_a_domain_reason(case.operation.label, response):
            return None
        raise


# Every check schemathesis has, none left out; positive_data_acceptance with DOMAIN_REFUSALS.
CHECKS = [
    positive_data_acceptance_but_domain_refusals if check is positive_data_acceptance else check
    for check in REGISTERED_CHECKS.get_all()
]
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
    from billing.models import BillingRun, UsageRecord
    from capacity.models import DiscoveryRun, MaintenanceWindow, MigLayout, SpecAndCount, TimeSlicingPolicy
    from monitoring.models import HealthEvent, IdleReservation, Series
    from pools.models import Allocation, BestEffortRequest
    from pricing.models import RateCard

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


def _strategy(operation, ids: dict[str, int], token_id: int | None):
    """Valid and invalid requests (schemathesis' positive and negative modes), on generated ids and,
    for detail operations, on the id of a real object too."""
    generated = [operation.as_strategy(generation_mode=mode) for mode in MODES]
    names = {p.name for p in operation.path_parameters}
    known = {}
    if "id" in names:
        resource = _resource(operation.path)
        value = token_id if resource == "tokens" else ids.get(resource)
        if value is not None:
            known["id"] = value
    if "user_id" in names:
        known["user_id"] = ids["user_id"]
    if not known:
        return st.one_of(generated)
    real = [operation.as_strategy(generation_mode=mode, path_parameters=known) for mode in MODES]
    return st.one_of(real + generated)


def coverage_cases(api_schema, operation):
    """schemathesis' coverage phase for one operation, valid and invalid: boundary values, each
    property missing or of the wrong type, unexpected properties, wrong content types; a fixed list
    (no seed), as `st run` sends before it fuzzes."""
    return CoverageGenerator(
        operation=operation,
        generation_modes=MODES,
        generation_config=api_schema.config.generation_for(operation=operation, phase="coverage"),
        auth_storage=None,
        override=Override(),
        feedback=NO_FEEDBACK,
    )


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


def selected_personas() -> list[str]:
    """The personas GPUAAS_SCHEMATHESIS_PERSONAS names (bench schemathesis --persona), in PERSONAS' order;
    all three unless it is set."""
    named = env_list("GPUAAS_SCHEMATHESIS_PERSONAS", PERSONAS)
    if unknown := set(named) - set(PERSONAS):
        raise ValueError(f"GPUAAS_SCHEMATHESIS_PERSONAS: no persona {', '.join(sorted(unknown))} (of {PERSONAS})")
    return [persona for persona in PERSONAS if persona in named]


@pytest.mark.parametrize("persona", selected_personas())
def test_every_operation_answers_as_the_schema_says(request, monkeypatch, persona, api_schema, ids):
    from django.db import connection

    from gpuaas.web.access import AnonThrottle, UserThrottle
    from tenancy.models import ApiToken

    # Thousands of requests a minute: the throttles still run, at rates these never reach.
    monkeypatch.setattr(AnonThrottle, "rate", "1000000/minute", raising=False)
    monkeypatch.setattr(UserThrottle, "rate", "1000000/minute", raising=False)

    examples = env_int("GPUAAS_SCHEMATHESIS_EXAMPLES", EXAMPLES, minimum=1)
    run_seed = env_int("GPUAAS_SCHEMATHESIS_SEED", SEED)
    database = example_database(record=env_bool("GPUAAS_SCHEMATHESIS_RECORD", False))
    report = env_str("GPUAAS_SCHEMATHESIS_REPORT")
    coverage = env_bool("GPUAAS_SCHEMATHESIS_COVERAGE", False)

    if persona == "anonymous":
        token_id, headers = None, {}
    else:
        user = request.getfixturevalue(persona)
        token, key = ApiToken.issue(user, "schemathesis", timezone.now() + timedelta(days=1))
        token_id, headers = token.pk, {"Authorization": f"Bearer {key}"}
    failures: dict[str, list[str]] = {}
    messages = []
    cases = hashlib.sha256()  # every request sent, in order: two runs that agree sent the same ones
    sent = 0
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 50
    only = env_str("GPUAAS_SCHEMATHESIS_ONLY")  # replaying failures: a regular expression of operation labels
    if only:
        operations = [operation for operation in operations if re.search(only, operation.label)]

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

        coverage_failures: set[str] = set()
        for case in coverage_cases(api_schema, operation) if coverage else ():
            try:
                check(case)
            except (Exception, BaseExceptionGroup) as exc:
                if not coverage_failures:
                    messages.append(f"{operation.label} (coverage phase): {exc}")
                coverage_failures.update(failure_kinds(exc))

        check = derandomised(
            check,
            strategy=_strategy(operation, ids, token_id),
            examples=examples,
            run_seed=run_seed,
            database=database,
            key=f"gpuaas-schemathesis {operation.label}",
        )

        try:
            check()
        except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure, then report them all
            coverage_failures.update(failure_kinds(exc))
            messages.append(f"{operation.label}: {exc}")
        if coverage_failures:
            failures[operation.label] = sorted(coverage_failures)

    if report:
        line = {
            "persona": persona,
            "database": connection.vendor,
            "examples": examples,
            "coverage": coverage,
            "seed": run_seed,
            "operations": len(operations),
            "cases": sent,
            "cases_sha256": cases.hexdigest(),
            "failures": failures,
            "messages": [message[:3000] for message in messages],  # the bench prints these, not the log
        }
        with open(report, "a") as out:
            out.write(json.dumps(line) + "\n")
    assert not messages, f"{len(messages)} operations failed:\n\n" + "\n\n".join(messages)


class _Answer:
    def __init__(self, status_code: int, body):
        self.status_code, self._body = status_code, body

    def json(self):
        return self._body


def test_a_domain_refusal_excuses_a_400_naming_only_its_fields():
    label = "POST /api/v1/pool-requests/"
    assert refused_for_a_domain_reason(label, _Answer(400, {"project": ["Invalid pk"]}))
    assert refused_for_a_domain_reason(label, _Answer(400, {"project": ["x"], "start_at": ["y"]}))
    assert not refused_for_a_domain_reason(label, _Answer(400, {"project": ["x"], "name": ["y"]}))
    assert not refused_for_a_domain_reason(label, _Answer(400, {}))
    assert not refused_for_a_domain_reason(label, _Answer(409, {"project": ["x"]}))
    assert not refused_for_a_domain_reason("POST /api/v1/tokens/", _Answer(400, {"project": ["x"]}))


def test_a_reconfiguration_naming_only_its_node_is_a_documented_refusal(operator, ids):
    """The 75-example run (issue #31): {"node": 1}, schema-valid, is refused (non_field_errors: exactly one
    of layout, named and per_gpu), which a schema of optional, nullable properties cannot state."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(operator)
    response = client.post("/api/v1/mig-reconfigurations/", {"node": ids["capacity/nodes"]}, format="json")

    assert response.status_code == 400
    assert response.json() == {"non_field_errors": ["give exactly one of a layout, a named config or per-GPU profiles"]}
    assert refused_for_a_domain_reason("POST /api/v1/mig-reconfigurations/", response)


def test_every_check_schemathesis_has_runs():
    from schemathesis.checks import load_all_checks

    load_all_checks()
    names = {check.__name__ for check in CHECKS}
    assert {check.__name__ for check in REGISTERED_CHECKS.get_all()} - names == {"positive_data_acceptance"}
    assert "positive_data_acceptance_but_domain_refusals" in names
    assert len(CHECKS) == len(REGISTERED_CHECKS.get_all()) >= 14


def test_the_bench_counts_every_kind_for_every_persona():
    from benchmarks.api_schema import KINDS, summarise

    lines = [
        {"persona": "operator", "failures": {"GET /api/v1/pools/": ["JsonSchemaError"]}},
        {"persona": "bob", "failures": {}},
        {"persona": "anonymous", "failures": {}},
    ]
    summary = summarise(lines)

    assert summary["failures"] == 1
    assert summary["failures_by_kind"] == {kind: int(kind == "JsonSchemaError") for kind in sorted(KINDS)}
    assert summary["failures_by_persona"]["bob"] == dict.fromkeys(sorted(KINDS), 0)
    assert summary["failing_operations"] == {"GET /api/v1/pools/": ["operator"]}


def test_the_bench_runs_the_personas_and_operations_it_is_given(monkeypatch, tmp_path):
    """--persona and --operations reach the test (GPUAAS_SCHEMATHESIS_PERSONAS, GPUAAS_SCHEMATHESIS_ONLY),
    and one report line per persona run is enough."""
    from benchmarks import api_schema

    seen = {}

    def fake_pytest(command, *, env, **_):
        seen.update(env)
        with open(env["GPUAAS_SCHEMATHESIS_REPORT"], "a") as out:
            for persona in env["GPUAAS_SCHEMATHESIS_PERSONAS"].split(","):
                line = {"persona": persona, "database": "sqlite", "operations": 1, "cases": 3, "failures": {}}
                out.write(json.dumps(line) + "\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(api_schema.subprocess, "run", fake_pytest)
    result = api_schema.run(examples=5, seed=7, persona=["anonymous", "operator"], operations="POST /api/v1/tokens/$")

    assert (seen["GPUAAS_SCHEMATHESIS_PERSONAS"], seen["GPUAAS_SCHEMATHESIS_ONLY"]) == (
        "operator,anonymous",
        "POST /api/v1/tokens/$",
    )
    assert (result["personas"], result["only"], result["failures"]) == (
        ["operator", "anonymous"],
        "POST /api/v1/tokens/$",
        0,
    )
    assert result["cases"] == {"operator": 3, "anonymous": 3}

    api_schema.run(examples=5, seed=7)
    assert (seen["GPUAAS_SCHEMATHESIS_PERSONAS"], seen["GPUAAS_SCHEMATHESIS_ONLY"]) == ("operator,bob,anonymous", "")
    with pytest.raises(SystemExit, match="not a regular expression"):
        api_schema.run(examples=5, seed=7, operations="(")


def test_the_personas_run_are_those_the_bench_names(monkeypatch):
    monkeypatch.delenv("GPUAAS_SCHEMATHESIS_PERSONAS", raising=False)
    assert selected_personas() == ["operator", "bob", "anonymous"]
    monkeypatch.setenv("GPUAAS_SCHEMATHESIS_PERSONAS", "anonymous,bob")
    assert selected_personas() == ["bob", "anonymous"]
    monkeypatch.setenv("GPUAAS_SCHEMATHESIS_PERSONAS", "bob,alice")
    with pytest.raises(ValueError, match="alice"):
        selected_personas()
