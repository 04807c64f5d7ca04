"""Benchmarks of the pools app (`python manage.py bench api|approvals`).

Both build their data in a throwaway database (`<name>_bench` on PostgreSQL, a file under
VAR_DIR on SQLite), created with migrations like a test database and dropped afterwards, so the
configured database is never touched.

- api: the self-service API served by waitress on loopback (a thread of this process), loaded by
  worker processes of keep-alive http.client GETs with token auth, for the pool-request and
  allocation lists as a member of USER_PROJECTS of PROJECTS projects, then as a superuser (no
  permission filtering). Query counts are measured in-process at page sizes 10 and 100.
- approvals: WORKERS threads approve REQUESTS single-unit MIG requests competing for UNITS units, of a
  tier and profile the tier profile policy admits as it stands (approval_spec), so a policy change
  cannot leave it approving nothing.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import statistics
import threading
import time
from pathlib import Path
from unittest import mock

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import CommandError
from django.core.wsgi import get_wsgi_application
from django.db import connection, connections
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle
from waitress import create_server

from capacity import tiers
from capacity.choices import Tier
from capacity.models import Cluster, GpuCapacity, MigInstance, MigPlacement, MigProfile, NodeCapacity
from pools import services
from pools.exceptions import DomainError, InsufficientCapacity
from pools.models import Allocation, GpuPool, PoolRequest
from tenancy.choices import Role
from tenancy.models import ApiToken, Project, ProjectGroupObjectPermission
from tenancy.roles import ROLE_PERMISSIONS, group_name

from .loadgen import hammer
from .registry import Smoke, arg, benchmark
from .targets import Expr, correctness, performance

BENCH_PAGE_SIZE = 50
LIST_PATHS = ("/api/v1/pool-requests/", "/api/v1/allocations/")


CLONE_ENV = "BENCH_CLONE_DATABASE"


@contextlib.contextmanager
def bench_database(keep: bool = False, suffix: str = "bench", clone: bool | None = None):
    """Create a fresh migrated database for the benchmark, and drop it afterwards (unless `keep`).

    Named after the configured one with `suffix` (`<name>_bench`). With `clone` (by default: when
    BENCH_CLONE_DATABASE=1 is in the environment, which `bench smoke` sets because the configured database
    is then a fresh migrated one made for the run) the configured database is copied instead (CREATE
    DATABASE ... TEMPLATE, a file copy on SQLite): a second instead of half a minute of migrations."""
    db = settings.DATABASES["default"]
    old_name = db["NAME"]
    if os.environ.get(CLONE_ENV) == "1" if clone is None else clone:
        clone_name = connection.creation.get_test_db_clone_settings(suffix)["NAME"]
        connection.creation.clone_test_db(suffix, verbosity=0, autoclobber=True)
        db["NAME"] = connection.settings_dict["NAME"] = clone_name
    else:
        if connection.vendor == "sqlite":
            db.setdefault("TEST", {})["NAME"] = str(settings.VAR_DIR / f"{Path(old_name).stem}-{suffix}.sqlite3")
        else:
            db.setdefault("TEST", {})["NAME"] = f"{old_name}_{suffix}"
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        yield db["NAME"]
    finally:
        connections.close_all()
        if not keep:
            if connection.vendor == "postgresql":
                # The server's worker threads keep their own connections (CONN_MAX_AGE): end them.
                with connection._nodb_cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                        [db["NAME"]],
                    )
            connection.creation.destroy_test_db(old_name, verbosity=0)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def h100_fleet(cluster, gpus: int, *, batch: int | None = None, node=None, gpu=None) -> list[GpuCapacity]:
    """`gpus` H100 GPUs of `cluster`, eight per new ready node; `node` and `gpu` add fields to the rows."""
    nodes = NodeCapacity.objects.bulk_create(
        [NodeCapacity(cluster=cluster, name=f"n{i:05d}", ready=True, **(node or {})) for i in range((gpus + 7) // 8)],
        batch,
    )
    return GpuCapacity.objects.bulk_create(
        [
            GpuCapacity(
                node=nodes[i // 8],
                index=i % 8,
                uuid=f"GPU-{i:06d}",
                product="NVIDIA H100 80GB HBM3",
                catalog_product="H100-80GB",
                **(gpu or {}),
            )
            for i in range(gpus)
        ],
        batch,
    )


# --- bench api -----------------------------------------------------------------------------------


def build_api_world(projects: int, user_projects: int, *, stdout=None) -> dict:
    """PROJECTS projects, each with an admin, a held request (pool + one full-GPU allocation) and a
    submitted one; the member belongs to USER_PROJECTS of them. Bulk inserts throughout."""

    started = time.perf_counter()
    User = get_user_model()
    batch = 2000
    project_rows = Project.objects.bulk_create(
        [Project(name=f"Project {i}", slug=f"p{i:05d}", namespace=f"p{i:05d}") for i in range(projects)], batch
    )
    perms = {
        p.codename: p
        for p in Permission.objects.filter(content_type__app_label="tenancy", content_type__model="project")
    }
    # Every project has an admin group; the member's projects also a member group (role_group's shape).
    groups = Group.objects.bulk_create(
        [Group(name=group_name(p, Role.ADMIN)) for p in project_rows]
        + [Group(name=group_name(p, Role.MEMBER)) for p in project_rows[:user_projects]],
        batch,
    )
    grants = []
    for group in groups:
        slug, role = group.name.split(":")[1:]
        project = project_rows[int(slug[1:])]
        grants.extend(
            ProjectGroupObjectPermission(group=group, permission=perms[c], content_object=project)
            for c in ROLE_PERMISSIONS[role]
        )
    ProjectGroupObjectPermission.objects.bulk_create(grants, batch)
    admins = User.objects.bulk_create([User(username=f"admin{i:05d}") for i in range(projects)], batch)
    through = User.groups.through
    through.objects.bulk_create(
        [through(user=u, group=g) for u, g in zip(admins, groups[:projects], strict=True)], batch
    )
    member = User.objects.create_user("bench-member")
    through.objects.bulk_create([through(user=member, group=g) for g in groups[projects:]], batch)
    superuser = User.objects.create_superuser("bench-superuser", "", "x")

    cluster = Cluster.objects.create(name="bench", kubeconfig_path="/dev/null")
    gpus = h100_fleet(cluster, projects, batch=batch, node={"tier": "full", "gpu_count": 8})
    common = dict(isolation="full", tier="full", spec_kind="full", product="H100-80GB", count=1)
    held = PoolRequest.objects.bulk_create(
        [PoolRequest(project=p, requested_by=admins[i], state="active", **common) for i, p in enumerate(project_rows)],
        batch,
    )
    PoolRequest.objects.bulk_create(
        [
            PoolRequest(project=p, requested_by=admins[i], state="submitted", **common)
            for i, p in enumerate(project_rows)
        ],
        batch,
    )
    pools = GpuPool.objects.bulk_create(
        [
            GpuPool(
                project_id=r.project_id,
                request=r,
                cluster=cluster,
                name=f"pool-{r.pk}",
                workload_type="training",
                tier="full",
                state="active",
            )
            for r in held
        ],
        batch,
    )
    Allocation.objects.bulk_create(
        [
            Allocation(
                pool=pool,
                project_id=pool.project_id,
                kind="full",
                gpu=gpus[i],
                resource_name="nvidia.com/gpu",
                product="H100-80GB",
                compute_slices=7,
            )
            for i, pool in enumerate(pools)
        ],
        batch,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # planner statistics, as autovacuum would have them in production
    keys = {
        "member": ApiToken.issue(member, "bench")[1],
        "superuser": ApiToken.issue(superuser, "bench")[1],
    }
    if stdout is not None:
        stdout.write(f"built {projects} projects in {time.perf_counter() - started:.1f} s\n")
    return keys


def measure_queries(key: str) -> dict[int, int]:
    """Queries per list request (the most over both lists) at page sizes 10 and 100, token auth included."""

    client = APIClient(SERVER_NAME="127.0.0.1")  # an allowed host outside the test runner
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.get("/api/v1/projects/")  # the first use of a token records last_used_at
    counts = {}
    for size in (10, 100):
        worst = 0
        for path in LIST_PATHS:
            with CaptureQueriesContext(connection) as captured:
                response = client.get(path, {"page_size": size})
            assert response.status_code == 200, response.content[:200]
            worst = max(worst, len(captured))
        counts[size] = worst
    return counts


def _load(port: int, key: str, clients: int, seconds: float) -> tuple[list[float], int]:
    paths = [f"{p}?page_size={BENCH_PAGE_SIZE}" for p in LIST_PATHS]
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json"}
    with multiprocessing.get_context("spawn").Pool(clients) as workers:
        results = workers.starmap(hammer, [("127.0.0.1", port, paths, headers, seconds)] * clients)
    latencies = [lat for r in results for lat in r["latencies"]]
    return latencies, sum(r["errors"] for r in results)


@benchmark(
    "api",
    help="Pool-request and allocation lists over real HTTP: member of USER_PROJECTS of PROJECTS vs superuser.",
    arguments=[
        arg("--projects", type=int, default=10000),
        arg("--user-projects", type=int, default=100),
        arg("--seconds", type=float, default=12.0, help="load time per persona, split into rounds"),
        arg("--rounds", type=int, default=3, help="member and superuser phases alternate this many times"),
        arg("--clients", type=int, default=4, help="load-generating processes"),
        arg("--threads", type=int, default=4, help="waitress worker threads"),
        arg("--keep-db", action="store_true"),
    ],
    targets=[
        correctness("errors", "==", 0),
        correctness("queries_per_request", "<=", 8),
        correctness("queries_page_size_10", "==", "queries_page_size_100"),
        correctness("queries_superuser_page_size_10", "==", "queries_superuser_page_size_100"),
        performance("ratio", ">=", 0.8),
    ],
    smoke=Smoke(("--projects", "20", "--user-projects", "5", "--seconds", "1", "--rounds", "1", "--clients", "1")),
)
def api_benchmark(*, stdout, projects, user_projects, seconds, rounds, clients, threads, keep_db, **_):
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "queue depth" is the point of a load test
    if user_projects > projects:
        raise ValueError("--user-projects cannot exceed --projects")
    with bench_database(keep_db):
        keys = build_api_world(projects, user_projects, stdout=stdout)
        queries = measure_queries(keys["member"])
        queries_superuser = measure_queries(keys["superuser"])
        connections.close_all()
        fast = {"user": "1000000000/second", "anon": "1000000000/second"}
        with mock.patch.dict(SimpleRateThrottle.THROTTLE_RATES, fast):
            server = create_server(get_wsgi_application(), host="127.0.0.1", port=0, threads=threads)
            serving = threading.Thread(target=server.run, daemon=True)
            serving.start()
            try:
                timings = {"member": ([], 0), "superuser": ([], 0)}
                for _ in range(rounds):  # alternate, so a noisy neighbour hurts both alike
                    for persona in ("member", "superuser"):
                        lat, err = _load(server.effective_port, keys[persona], clients, seconds / rounds)
                        timings[persona] = (timings[persona][0] + lat, timings[persona][1] + err)
            finally:
                server.close()
                serving.join(timeout=5)
    member, superuser = timings["member"][0], timings["superuser"][0]
    rps = len(member) / seconds
    rps_superuser = len(superuser) / seconds
    return {
        "benchmark": "api",
        "database": connection.vendor,
        "projects": projects,
        "user_projects": user_projects,
        "clients": clients,
        "server_threads": threads,
        "page_size": BENCH_PAGE_SIZE,
        "requests": len(member),
        "rps": round(rps, 1),
        "p50_ms": round(_percentile(member, 0.5), 2),
        "p99_ms": round(_percentile(member, 0.99), 2),
        "queries_per_request": max(queries.values()),
        "queries_page_size_10": queries[10],
        "queries_page_size_100": queries[100],
        "queries_superuser_page_size_10": queries_superuser[10],
        "queries_superuser_page_size_100": queries_superuser[100],
        "requests_superuser": len(superuser),
        "rps_superuser": round(rps_superuser, 1),
        "p50_ms_superuser": round(_percentile(superuser, 0.5), 2),
        "p99_ms_superuser": round(_percentile(superuser, 0.99), 2),
        "ratio": round(rps / rps_superuser, 3) if rps_superuser else None,
        "errors": timings["member"][1] + timings["superuser"][1],
    }


# --- bench approvals -----------------------------------------------------------------------------


def units_per_gpu(profile: MigProfile) -> list[MigPlacement]:
    """The most instances of `profile` one empty GPU holds: non-overlapping placements, first start first."""
    taken: list[MigPlacement] = []
    for placement in sorted(profile.valid_placements.all(), key=lambda p: p.start):
        if len(taken) < profile.max_instances and all(p.start + p.size <= placement.start for p in taken):
            taken.append(placement)
    return taken


def approval_spec(product: str = "H100-80GB") -> tuple[str, MigProfile]:
    """The tier and MIG profile the approvals world is built of, read from the tier profile policy as it
    stands (capacity.tiers): of the profiles some tier admits, the one with the most units per GPU (the
    most approvals competing for each GPU's rows), on the first tier that admits it."""
    table = tiers.policies()
    admitted = [
        (tier, profile)
        for profile in MigProfile.objects.filter(product=product).prefetch_related("valid_placements")
        for tier in tiers.tiers_allowing(product, profile.name, table)
    ]
    if not admitted:
        raise RuntimeError(f"the tier profile policy admits no {product} MIG profile on any tier")
    order = {tier: i for i, tier in enumerate(Tier.values)}
    return min(admitted, key=lambda tp: (-len(units_per_gpu(tp[1])), order[tp[0]], tp[1].compute_slices))


def build_approval_world(requests: int, units: int) -> tuple[list[int], str, MigProfile]:
    """UNITS free MIG instances of the profile approval_spec() picks (as many per H100 as fit, eight GPUs
    per node, on nodes of its tier) and REQUESTS submitted single-unit requests for it over 20 projects;
    returns the request ids in creation order, the tier and the profile."""

    tier, profile = approval_spec()
    user = get_user_model().objects.create_user("bench-requester")
    cluster = Cluster.objects.create(name="bench", kubeconfig_path="/dev/null")
    placements = units_per_gpu(profile)
    per_gpu = len(placements)
    gpu_count = (units + per_gpu - 1) // per_gpu
    gpus = h100_fleet(cluster, gpu_count, node={"tier": tier, "mig_strategy": "mixed"}, gpu={"mig_mode_current": True})
    MigInstance.objects.bulk_create(
        MigInstance(
            gpu=gpus[u // per_gpu],
            profile=profile,
            placement=placements[u % per_gpu],
            placement_start=placements[u % per_gpu].start,
            placement_size=placements[u % per_gpu].size,
            uuid=f"MIG-{u:05d}",
        )
        for u in range(units)
    )
    projects = Project.objects.bulk_create(Project(name=f"P{i}", slug=f"p{i}", namespace=f"p{i}") for i in range(20))
    rows = PoolRequest.objects.bulk_create(
        PoolRequest(
            project=projects[i % 20],
            requested_by=user,
            isolation="mig",
            tier=tier,
            spec_kind="mig",
            product=profile.product,
            profile_name=profile.name,
            count=1,
            state="submitted",
        )
        for i in range(requests)
    )
    return [r.pk for r in rows], tier, profile


def double_allocated() -> int:
    """Units held by more than one active allocation (the constraints should make this impossible)."""

    active = Allocation.objects.active()
    mig = active.filter(mig_instance__isnull=False).values("mig_instance").annotate(n=Count("pk")).filter(n__gt=1)
    other = active.filter(mig_instance__isnull=True).values("gpu", "replica").annotate(n=Count("pk")).filter(n__gt=1)
    return mig.count() + other.count()


@benchmark(
    "approvals",
    help="WORKERS threads approving REQUESTS single-unit requests competing for UNITS MIG units.",
    arguments=[
        arg("--requests", type=int, default=200),
        arg("--units", type=int, default=100),
        arg("--workers", type=int, default=8),
        arg("--keep-db", action="store_true"),
    ],
    targets=[
        correctness("approved", "==", "units"),
        correctness("short_of_capacity", "==", Expr("requests - units", lambda r: r["requests"] - r["units"])),
        correctness("collisions", "==", 0),
        correctness("double_allocated", "==", 0),
    ],
    smoke=Smoke(("--requests", "8", "--units", "4", "--workers", "2")),
)
def approvals_benchmark(*, stdout, requests, units, workers, keep_db, **_):
    if requests < units:
        raise CommandError("--requests must be at least --units: the benchmark is requests competing for units")
    with bench_database(keep_db):
        ids, tier, profile = build_approval_world(requests, units)
        operator = get_user_model().objects.create_superuser("bench-operator", "", "x")
        work: queue.Queue[int] = queue.Queue()
        for pk in ids:
            work.put(pk)
        outcomes: list[str] = []
        latencies: list[float] = []
        lock = threading.Lock()

        def worker() -> None:
            try:
                while True:
                    try:
                        pk = work.get_nowait()
                    except queue.Empty:
                        return
                    request = PoolRequest.objects.get(pk=pk)
                    started = time.perf_counter()
                    try:
                        services.approve(request, actor=operator)
                        outcome = "approved"
                    except InsufficientCapacity:
                        outcome = "short"
                    except DomainError:
                        outcome = "collision"
                    elapsed = (time.perf_counter() - started) * 1000
                    with lock:
                        outcomes.append(outcome)
                        latencies.append(elapsed)
            finally:
                connection.close()

        # Provisioning would go to the broker: the benchmark measures approval only.
        with mock.patch.object(services, "enqueue_provisioning"):
            threads = [threading.Thread(target=worker) for _ in range(workers)]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - started
        approved = GpuPool.objects.count()
        result = {
            "benchmark": "approvals",
            "database": connection.vendor,
            "requests": requests,
            "units": units,
            "workers": workers,
            "tier": tier,
            "profile": profile.name,
            "approved": approved,
            "short_of_capacity": outcomes.count("short"),
            "collisions": outcomes.count("collision"),
            "double_allocated": double_allocated(),
            "seconds": round(elapsed, 3),
            "approvals_per_s": round(approved / elapsed, 1),
            "decisions_per_s": round(len(outcomes) / elapsed, 1),
            "p50_ms": round(statistics.median(latencies), 2) if latencies else 0.0,
            "p99_ms": round(_percentile(latencies, 0.99), 2),
        }
    return result
