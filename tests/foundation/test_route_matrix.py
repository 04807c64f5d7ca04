"""Every URL pattern, every persona: the answer each one gets comes from the route's declared scope.

The walk is gpuaas.checks.routes() (the same list `manage.py check` inspects): the shared API router
and its extra paths, the project pages, the accounts pages, /metrics, the dashboard and the admin's
own views. Path parameters are filled from one world of two projects: team-a's objects ("own"),
team-b's objects ("other") and objects of no project ("fleet"). Each persona sends a GET and each
write the route offers (an empty JSON body: a write that passes the gate then fails validation or
state, which is enough to show it passed). Expected answers come from EXPECTED, keyed by scope,
never from per-route lists, so:

- a route that declares no scope fails here (and in `manage.py check`);
- a new route whose objects the world does not know fails here until _world_objects() names them;
- a refused write (401, 403, 404, or a redirect to a sign-in page) must leave every table as it was.

Django admin model pages follow one rule (non-staff sent to the admin login, staff without the
model permission 403, superusers in) and are sampled through each model's changelist; the admin's
custom views (dashboard, capacity plan, take-offline, rebalance, members) are walked in full.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import time, timedelta
from pathlib import Path

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gpuaas.checks import routes
from core.permissions import ProjectScopedQuerysetMixin
from core.scopes import Scope

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboard"))
from dashboard_world import add_signals, build_world  # noqa: E402

PERSONAS = ("anonymous", "outsider", "viewer", "member", "admin", "staff_nobody", "staff_operator", "superuser")
PUBLIC_PERSONAS = ("anonymous", "member")  # a public route answers everyone alike: two stand for all
A_ROLES = ("viewer", "member", "admin")
OPERATORS = ("staff_operator", "superuser")
WRITES = ("post", "put", "patch", "delete")

# --- What each persona gets, by scope -------------------------------------------------------------
# Outcomes: OK = past the gate (2xx, 3xx elsewhere than a sign-in page, or 400/409 from the body or
# the object's state); LOGIN = 401 or a redirect to a sign-in page; FORBIDDEN = 403; MISSING = 404.
OK, LOGIN, FORBIDDEN, MISSING = "ok", "login", "forbidden", "missing"
REFUSED = frozenset({LOGIN, FORBIDDEN})  # plain operator views refuse with 401 (/metrics), a login redirect or 403


def _expected(scope: str, persona: str, target: str, write: bool, *, plain: bool, object_scoped: bool) -> frozenset:
    """The outcomes allowed for `persona` on a route of `scope`, aimed at `target` (collection/own/other/fleet)."""
    if scope == Scope.PUBLIC:  # answered for everyone (the front door may send anonymous callers to sign in)
        return frozenset({OK, LOGIN})
    if persona == "anonymous":
        return frozenset({LOGIN})
    if scope == Scope.SIGNED_IN:
        return frozenset({OK})
    if scope == Scope.OWN_USER:  # the "own" object is the member's API token: theirs alone, operators included
        return frozenset({OK}) if target == "collection" or persona == "member" else frozenset({MISSING})
    if scope == Scope.PROJECT:
        if target == "collection" or persona in OPERATORS:
            return frozenset({OK})
        if target == "other" or persona not in A_ROLES:
            return frozenset({MISSING})
        if persona == "viewer":  # reads; some pages (request form) need more than viewing
            return frozenset({FORBIDDEN}) if write else frozenset({OK, FORBIDDEN})
        if persona == "member":  # requests capacity; managing members and releasing are the admin's
            return frozenset({OK, FORBIDDEN}) if write else frozenset({OK})
        return frozenset({OK})
    if scope == Scope.OPERATOR:
        if persona in OPERATORS:
            return frozenset({OK})
        if object_scoped and target in ("own", "other"):  # another project's object stays a 404 before any 403
            return frozenset({FORBIDDEN}) if target == "own" and persona in A_ROLES else frozenset({MISSING})
        return REFUSED if plain else frozenset({FORBIDDEN})
    raise AssertionError(f"scope {scope!r} is not in the table: add its row to _expected()")


# --- The world ------------------------------------------------------------------------------------


@dataclass
class Target:
    kwargs: dict
    target: str  # collection, own, other, fleet


def _world_objects():
    """Two projects with pools, requests, allocations, metrics, billing rows; fleet objects; personas."""
    from billing import services as billing_services
    from billing.models import BillingRun, RateCard, Statement, UsageRecord
    from capacity.models import (
        DiscoveryRun,
        MaintenanceWindow,
        MigLayout,
        MigReconfiguration,
        NodeDrain,
        SpecAndCount,
        TierAssignment,
        TierProfilePolicy,
        TimeSlicingPolicy,
    )
    from monitoring.models import IdleReservation, Series, TrespassEvent
    from pools.models import Allocation, AutoApprovalPolicy, BestEffortRequest
    from tenancy.models import ApiToken, Project
    from tenancy.roles import operators_group, set_role

    users = get_user_model().objects
    team_a = Project.objects.create(name="Team A", slug="team-a", namespace="team-a")
    team_b = Project.objects.create(name="Team B", slug="team-b", namespace="team-b")
    people = {
        "outsider": users.create_user("oscar", "oscar@example.com", "pw-oscar-1"),
        "viewer": users.create_user("victor", "victor@example.com", "pw-victor-1"),
        "member": users.create_user("bob", "bob@example.com", "pw-bob-1"),
        "admin": users.create_user("alice", "alice@example.com", "pw-alice-1"),
        "staff_nobody": users.create_user("sam", "sam@example.com", "pw-sam-1", is_staff=True),
        "staff_operator": users.create_user("olga", "olga@example.com", "pw-olga-1", is_staff=True),
        "superuser": users.create_superuser("root", "root@example.com", "pw-root-1"),
    }
    for role in A_ROLES:
        set_role(team_a, people[role], role)
    bravo = users.create_user("bravo", "bravo@example.com", "pw-bravo-1")
    set_role(team_b, bravo, "admin")
    people["staff_operator"].groups.add(operators_group())

    world = build_world(team_a, team_b)
    signals = add_signals(world)
    period = timezone.now().date().replace(day=1)
    if not RateCard.objects.exists():
        RateCard.objects.create(name="list", effective_from=timezone.now().replace(minute=0, second=0, microsecond=0))
    statements = {p: billing_services.generate_statement(p, period) for p in (team_a, team_b)}
    statements = {p: Statement.objects.get(project=p, period=period) for p in statements}
    a_alloc = Allocation.objects.filter(project=team_a).order_by("pk").first()
    b_alloc = Allocation.objects.filter(project=team_b).order_by("pk").first()
    IdleReservation.objects.create(
        allocation=b_alloc,
        window_start=timezone.now() - timedelta(hours=24),
        window_end=timezone.now(),
        sm_active_avg=0.1,
        coverage=0.9,
        proposal="release",
    )
    trespass = {
        p: TrespassEvent.objects.create(
            kind="foreign_pod",
            gpu=alloc.gpu,
            mig_instance=alloc.mig_instance,
            unit_key=f"matrix:{alloc.pk}",
            owner_project=p,
        )
        for p, alloc in ((team_a, a_alloc), (team_b, b_alloc))
    }
    node = world.gpus["a2-0"].node
    if not SpecAndCount.objects.exists():
        SpecAndCount.objects.create(
            node=node, kind="full", product="H100-80GB", resource_name="nvidia.com/gpu", count=1, allocatable=1
        )
    token, _ = ApiToken.issue(people["member"], "matrix")
    events = {e.gpu_id: e for e in signals["events"]}

    def pair(own, other) -> dict:
        return {"own": own.pk, "other": other.pk}

    def fleet(obj) -> dict:
        return {"fleet": obj.pk}

    b_pool = world.pools["batch"]
    a_pool = world.pools["inference"]
    objects = {  # by DRF basename or URL name: which object fills `pk` for each target
        "project": pair(team_a, team_b),
        "poolrequest": pair(world.pending, b_pool.request),
        "besteffortrequest": pair(
            BestEffortRequest.objects.create(project=team_a, product="H100-80GB", profile_name="3g.40gb"),
            BestEffortRequest.objects.create(project=team_b, product="H100-80GB", profile_name="3g.40gb"),
        ),
        "gpupool": pair(a_pool, b_pool),
        "allocation": pair(a_alloc, b_alloc),
        "apitoken": {"own": token.pk},
        "ratecard": fleet(RateCard.objects.order_by("pk").first()),
        "autoapprovalpolicy": fleet(AutoApprovalPolicy.objects.create(name="matrix")),
        "usagerecord": pair(
            UsageRecord.objects.filter(project=team_a).first(), UsageRecord.objects.filter(project=team_b).first()
        ),
        "statement": pair(statements[team_a], statements[team_b]),
        "billingrun": fleet(BillingRun.objects.create(kind="close", period=period)),
        "metric-series": pair(
            Series.objects.get(mig_instance=world.instances["a1-0-3g@0"]),
            Series.objects.get(mig_instance=world.instances["a1-1-1g@4"]),
        ),
        "pool-utilisation": pair(a_pool, b_pool),
        "health-event": pair(events[world.gpus["a2-0"].pk], events[world.gpus["a1-1"].pk]),
        "idle-reservation": pair(
            IdleReservation.objects.get(allocation__project=team_a), IdleReservation.objects.get(allocation=b_alloc)
        ),
        "trespass-event": pair(trespass[team_a], trespass[team_b]),
        "capacity-cluster": fleet(world.alpha),
        "capacity-discovery-run": fleet(DiscoveryRun.objects.create(cluster=world.alpha)),
        "capacity-node": fleet(node),
        "capacity-gpu": fleet(world.gpus["a2-0"]),
        "capacity-spec": fleet(SpecAndCount.objects.order_by("pk").first()),
        "mig-layout": fleet(
            MigLayout.objects.create(name="halves", product="H100-80GB", gpus={"all": ["3g.40gb", "3g.40gb"]})
        ),
        "mig-reconfiguration": fleet(
            MigReconfiguration.objects.create(cluster=world.alpha, node=node, target={"0": None})
        ),
        "node-drain": fleet(NodeDrain.objects.create(cluster=world.alpha, node=node, reason="matrix")),
        "maintenance-window": fleet(
            MaintenanceWindow.objects.create(
                cluster=world.alpha, name="sunday", weekday=6, start_time=time(2), end_time=time(4)
            )
        ),
        "time-slicing-policy": fleet(
            TimeSlicingPolicy.objects.create(cluster=world.beta, node_group="shared", replicas=4)
        ),
        "tier-assignment": fleet(TierAssignment.objects.create(node=node, tier="full")),
        "tier-policy": fleet(TierProfilePolicy.objects.get(tier="1")),
        # plain views and the admin's own views, by URL name
        "projects:project": {"own": {"slug": team_a.slug}, "other": {"slug": team_b.slug}},
        "projects:request_new": {"own": {"slug": team_a.slug}, "other": {"slug": team_b.slug}},
        "projects:notifications": {"own": {"slug": team_a.slug}, "other": {"slug": team_b.slug}},
        "projects:pool": {
            "own": {"slug": team_a.slug, "pk": a_pool.pk},
            "other": {"slug": team_b.slug, "pk": b_pool.pk},
        },
        "projects:pool_series": {
            "own": {"slug": team_a.slug, "pk": a_pool.pk},
            "other": {"slug": team_b.slug, "pk": b_pool.pk},
        },
        "token_revoke": {"own": token.pk},
        "admin:capacity_cluster_onboard": fleet(world.alpha),
        "admin:gpuaas_dashboard_cluster": fleet(world.alpha),
        "admin:gpuaas_dashboard_cluster_data": fleet(world.alpha),
        "admin:gpuaas_dashboard_gpu": fleet(world.gpus["a1-0"]),
        "admin:gpuaas_dashboard_gpu_data": fleet(world.gpus["a1-0"]),
        "admin:tenancy_project_members": {"own": {"object_id": team_a.pk}},
        "admin:tenancy_project_permissions": {"own": {"object_pk": team_a.pk}},
        "admin:tenancy_project_permissions_manage_user": {
            "own": {"object_pk": team_a.pk, "user_id": people["member"].pk}
        },
        "admin:tenancy_project_permissions_manage_group": {
            "own": {"object_pk": team_a.pk, "group_id": people["member"].groups.first().pk}
        },
    }
    user_ids = {"own": people["member"].pk, "other": bravo.pk}
    return people, objects, user_ids


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """One world for the whole module, built once in a transaction that is rolled back at the end;
    each test runs in a savepoint inside it (pytest-django's `db`), each request in another one."""
    with django_db_blocker.unblock():
        with transaction.atomic():
            yield _world_objects()
            transaction.set_rollback(True)


@pytest.fixture
def clients(world, db) -> dict[str, Client]:
    """A signed-in client per persona, fresh for each test (a walked logout must not sign out the next one)."""
    people, _, _ = world
    signed_in = {"anonymous": Client()}
    for name, user in people.items():
        signed_in[name] = Client()
        signed_in[name].force_login(user)
    return signed_in


# --- Outcomes and the "nothing changed" snapshot -----------------------------------------------


def _outcome(response) -> str:
    status, location = response.status_code, response.get("Location", "")
    if status == 401 or (status == 302 and "/login/" in location):
        return LOGIN
    if status == 403 or (status == 302 and location == reverse("admin:index")):
        return FORBIDDEN  # guardian's permission pages send staff without the permission back to the index
    if status == 404:
        return MISSING
    if status >= 500:
        return f"error {status}"
    return OK  # 2xx, 3xx elsewhere, 400/405/409: past the gate


WRITE_TABLES = ("pools_%", "capacity_%", "billing_%", "monitoring_%", "auth_%", "guardian_%")


def _writes() -> tuple:
    """Rows inserted, updated and deleted so far in this transaction in every table a write could touch.

    PostgreSQL counts them per transaction (pg_stat_xact_user_tables), so "nothing changed" is one
    query however many tables; elsewhere, every such table's count and state fingerprint.
    """
    if connection.vendor == "postgresql":
        like = " OR ".join(["relname LIKE %s"] * len(WRITE_TABLES))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_xact_user_tables WHERE {like}",
                WRITE_TABLES,
            )
            return tuple(sorted(row for row in cursor.fetchall() if any(row[1:])))
    from django.apps import apps

    rows = []
    for app_label in ("pools", "capacity", "billing", "monitoring", "auth"):
        for model in apps.get_app_config(app_label).get_models():
            fields = {f.name for f in model._meta.concrete_fields}
            marks = [f for f in ("updated_at", "state", "revoked_at", "resolved_at", "released_at") if f in fields]
            if model._meta.is_composite_pk:
                rows.append((model.__name__, model.objects.count()))
            else:
                rows.append((model.__name__, list(model.objects.order_by("pk").values_list("pk", *marks))))
    return tuple(rows)


def _call(client, method: str, url: str, *, write_checked: bool):
    """One request in a savepoint that is rolled back: an allowed write never leaks into the next call.
    Returns (response, changed) where changed says whether any table differs afterwards."""
    with transaction.atomic():
        before = _writes() if write_checked else None
        kwargs = {"data": "{}", "content_type": "application/json"} if method in WRITES else {}
        response = getattr(client, method)(url, **kwargs)
        changed = write_checked and _writes() != before
        transaction.set_rollback(True)
    return response, changed


# --- The walk -------------------------------------------------------------------------------------

ALL_ROUTES = routes()
ADMIN_BUILTINS = {
    "login",
    "logout",
    "index",
    "password_change",
    "password_change_done",
    "jsi18n",
    "autocomplete",
    "view_on_site",
    "app_list",
}
MODEL_PAGE_SUFFIXES = ("_changelist", "_add", "_change", "_delete", "_history")


def _is_model_page(route) -> bool:
    return route.is_admin and (route.name is None or route.name.endswith(MODEL_PAGE_SUFFIXES))


def _key(route) -> tuple:
    return (route.namespace, route.name, route.path if route.name is None else "")


def _walked():
    """Each URL name once (format-suffix twins share their route's name), admin model pages excluded."""
    seen, walked = set(), []
    for route in ALL_ROUTES:
        if _is_model_page(route) or (route.is_admin and route.name in ADMIN_BUILTINS):
            continue
        key = _key(route)
        if key not in seen:
            seen.add(key)
            walked.append(route)
    return walked


def _route_id(route) -> str:
    return f"{route.namespace}:{route.name}" if route.namespace else (route.name or route.path)


def _targets(route, objects, user_ids) -> list[Target]:
    pattern = route.path
    if "<" not in pattern.replace("(?P<format>", ""):
        return [Target({}, "collection")]
    key = _route_id(route)
    basename = getattr(route.callback, "initkwargs", {}).get("basename")
    entry = objects.get(basename) if basename else objects.get(key)
    if entry is None:
        pytest.fail(f"{key} ({route.path}) takes an object the world does not know: add it to _world_objects()")
    targets = []
    for target, value in entry.items():
        kwargs = dict(value) if isinstance(value, dict) else {"pk": value}
        if "(?P<user_id>" in pattern:
            kwargs["user_id"] = user_ids[target]
        targets.append(Target(kwargs, target))
    return targets


def _methods(route) -> list[str]:
    if "*" in route.scopes:  # a plain view: a POST it does not take is a 405 for everyone, skipped
        return ["get", "post"]
    return [m for m in ("get", *WRITES) if m in route.scopes]


def _scope_of(route, method: str) -> str | None:
    if route.is_admin and "*" in route.scopes and route.scopes["*"] is None:
        return Scope.OPERATOR  # the admin's own views: staff-only pages gated by model permissions
    return route.scopes.get(method, route.scopes.get("*"))


@pytest.mark.django_db
@pytest.mark.parametrize("route", _walked(), ids=_route_id)
def test_every_route_answers_each_persona_as_its_scope_says(world, clients, route):
    _, objects, user_ids = world
    assert not route.problems, f"{_route_id(route)}: {'; '.join(route.problems)}"
    plain = getattr(route.callback, "cls", None) is None
    failures = []
    for target in _targets(route, objects, user_ids):
        url = reverse(_route_id(route), kwargs=target.kwargs) if route.name else "/" + route.path
        view_class = getattr(route.callback, "cls", None)
        object_scoped = bool(view_class) and issubclass(view_class, ProjectScopedQuerysetMixin)
        for method in _methods(route):
            scope = _scope_of(route, method)
            write = method in WRITES
            answers = {}
            for persona in PUBLIC_PERSONAS if scope == Scope.PUBLIC else PERSONAS:
                response, changed = _call(clients[persona], method, url, write_checked=write)
                answers[persona] = (response, changed)
            if {r.status_code for r, _ in answers.values()} == {405}:
                continue  # the route does not take this method
            for persona, (response, changed) in answers.items():
                allowed = _expected(scope, persona, target.target, write, plain=plain, object_scoped=object_scoped)
                outcome = _outcome(response)
                where = f"{method.upper()} {url} as {persona} (scope {scope}, {target.target})"
                if outcome not in allowed:
                    failures.append(f"{where}: {response.status_code} ({outcome}), expected {sorted(allowed)}")
                elif write and outcome != OK and changed:
                    failures.append(f"{where}: refused with {response.status_code} but a table changed")
    assert not failures, "\n".join(failures)


def test_every_route_is_walked_or_summarised():
    """The walk covers every URL pattern: walked (or a format-suffix twin of one), or an admin page under one rule."""
    walked = {_key(route) for route in _walked()}
    skipped = [
        route.path
        for route in ALL_ROUTES
        if _key(route) not in walked and not _is_model_page(route) and route.name not in ADMIN_BUILTINS
    ]
    assert skipped == []


# --- The admin: one rule for its model pages and built-ins --------------------------------------


@pytest.mark.django_db
def test_admin_model_pages_follow_one_rule(clients):
    """Non-staff are sent to the admin login, staff without the model permission get 403, superusers 200."""
    failures = []
    for model in admin.site._registry:
        prefix = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        url = reverse(f"{prefix}_changelist")
        expected = {"anonymous": LOGIN, "outsider": LOGIN, "member": LOGIN, "staff_nobody": FORBIDDEN, "superuser": OK}
        for persona, outcome in expected.items():
            response, _ = _call(clients[persona], "get", url, write_checked=False)
            if _outcome(response) != outcome:
                failures.append(f"GET {url} as {persona}: {response.status_code}, expected {outcome}")
        response, changed = _call(clients["staff_nobody"], "post", reverse(f"{prefix}_add"), write_checked=True)
        if _outcome(response) != FORBIDDEN or changed:
            failures.append(f"POST add {model.__name__} as staff_nobody: {response.status_code}, changed={changed}")
    assert not failures, "\n".join(failures)


@pytest.mark.django_db
def test_admin_built_in_pages_are_staff_only(clients):
    for name in ("index", "password_change", "jsi18n"):
        url = reverse(f"admin:{name}")
        for persona in ("anonymous", "outsider", "member"):
            assert _outcome(_call(clients[persona], "get", url, write_checked=False)[0]) == LOGIN, (url, persona)
        assert _call(clients["staff_nobody"], "get", url, write_checked=False)[0].status_code == 200, url
    assert _call(clients["anonymous"], "get", reverse("admin:login"), write_checked=False)[0].status_code == 200
