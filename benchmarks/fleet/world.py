"""The fleet world of `bench fleet` (issue #28), written with PostgreSQL COPY in minutes.

At scale 1: 10 clusters of 1,250 nodes (12,500 nodes, 100,000 GPUs, eight a node), H100-80GB in the even
clusters and H200-141GB in the odd ones; per ten nodes four are whole-GPU training nodes (tier full),
two MIG tier-1 nodes (4g + 3g on every GPU), two MIG tier-2 nodes (seven 1g instances a GPU, MIG mixed
strategy) and two time-sliced tier-3 nodes (four replicas a GPU), with the catalog's MigProfile and
MigPlacement rows. That is about 300,000 units, two thirds of them held by about 200,000 active
allocations in pools of ten units (one active request and pool each), so about 100,000 stay free.

10,000 projects, each with an admin, member and viewer group holding the role's object permissions
(tenancy.roles' shape); 20,000 users each in one to five projects (40 % one, 25 % two, 15 % three,
10 % four, 10 % five); ten operators (staff, Operators group: they see every project) and a superuser.
The measured member, `fleet-member`, belongs to the three oldest projects (the worst case for a plan
that walks the newest rows and filters), whose own rows are fixed: their active pools, 30 old
released requests each, a month of usage, twelve statements and 20 trespass events each.

Others' history grows in `grow(from, to)` slices so a benchmark can measure at 1 % of it and again
at all of it: 1,000,000 pool requests in all (active, 10,000 queued with their queue entries, the rest
released/expired/rejected/withdrawn/failed over the past year; one in four history requests was
released from a pool that held one full GPU, whose ended allocation is kept), usage, statements for
twelve months and 100,000 trespass events.

Usage is stored as the product stores it, one UsageRecord per allocation and hour. A month of hours
for all 200,000 allocations would be 144 million rows (about 20 GB), beyond the machine this runs on,
so the month (November 2026, 720 hours) is written for the member's allocations and for 2,000 of
the others' (1.44 million rows at scale 1).

Rows are valid for the product's code paths: every NOT NULL column gets the model field's default
where the builder does not set it, explicit ids keep foreign keys straight (sequences are reset
afterwards), allocations respect the one-active-holder constraints, and everything is derived from
the row index or a seeded Random, so two builds at one scale are identical.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Iterable, Iterator
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import CommandError
from django.db import connection, transaction

from billing.models import Statement, UsageRecord
from capacity.models import Cluster, GpuCapacity, MigInstance, MigPlacement, MigProfile, NodeCapacity
from monitoring.models import TrespassEvent
from pools.models import Allocation, GpuPool, PoolRequest
from pools.models.queue import QueueEntry
from tenancy.choices import Role
from tenancy.models import Project, ProjectGroupObjectPermission
from tenancy.roles import ROLE_PERMISSIONS, operators_group

from .copier import analyze, next_id, reset_sequences
from .shape import (
    ALLOCATION_FIELDS,
    GPUS_PER_NODE,
    HISTORY_STATES,
    HOURLY_RATE,
    HOURS,
    MEMBER,
    MEMBER_OLD_REQUESTS,
    MEMBER_PROJECTS,
    MEMBER_TRESPASS,
    MONTH,
    NOW,
    OPERATORS,
    POOL_FIELDS,
    POOL_UNITS,
    PRODUCTS,
    REQUEST_FIELDS,
    STATEMENT_MONTHS,
    SUPERUSER,
    TIMESLICE_REPLICAS,
    YEAR,
    Fleet,
    Unit,
    request_row,
)

# --- The world -----------------------------------------------------------------------------------


def require_postgresql() -> None:
    if connection.vendor != "postgresql":
        raise CommandError(
            "bench fleet builds its world with PostgreSQL COPY and measures PostgreSQL plans: set DATABASE_URL "
            f"to a PostgreSQL database (this one is {connection.vendor})."
        )


def build(scale: float = 1.0, *, seed: int = 28, stdout=None) -> Fleet:
    """The fleet, its projects and members, the active pools and allocations, the queue and the member's
    own history; none of the others' history yet (grow() adds it). One transaction per stage."""
    require_postgresql()
    fleet = Fleet(scale=scale, seed=seed)
    for stage in (_tenancy, _capacity, _active):
        started = time.perf_counter()
        with transaction.atomic():
            stage(fleet)
        fleet.build_s[stage.__name__.strip("_")] = round(time.perf_counter() - started, 2)
        if stdout is not None:
            stdout.write(f"fleet: {stage.__name__.strip('_')} built in {fleet.build_s[stage.__name__.strip('_')]} s\n")
    started = time.perf_counter()
    reset_sequences(_ALL)
    analyze(_ALL)
    fleet.build_s["analyze"] = round(time.perf_counter() - started, 2)
    return fleet


def _tenancy(fleet: Fleet) -> None:
    operators = operators_group()  # before the COPYs with explicit ids (it takes the next group id)
    sizes = fleet.sizes()
    rng = random.Random(fleet.seed)
    copier = fleet.copier
    p0 = next_id(Project)
    n = sizes["projects"]
    created = NOW - YEAR
    copier.copy(
        Project,
        ("id", "name", "slug", "namespace", "created_at"),
        ((p0 + i, f"Fleet project {i}", f"f{i:05d}", f"f{i:05d}", created + dt.timedelta(minutes=i)) for i in range(n)),
    )
    fleet.project_ids = list(range(p0, p0 + n))
    fleet.member_project_ids = fleet.project_ids[:MEMBER_PROJECTS]
    # One group per (project, role) with the role's object permissions on the project.
    perms = {
        p.codename: p.pk
        for p in Permission.objects.filter(content_type__app_label="tenancy", content_type__model="project")
    }
    roles = (Role.ADMIN, Role.MEMBER, Role.VIEWER)
    g0 = next_id(Group)
    group_of = {
        (p, role): g0 + i * len(roles) + r for i, p in enumerate(fleet.project_ids) for r, role in enumerate(roles)
    }
    copier.copy(
        Group,
        ("id", "name"),
        ((gid, f"project:f{p - p0:05d}:{role}") for (p, role), gid in group_of.items()),
    )
    copier.copy(
        ProjectGroupObjectPermission,
        ("group", "permission", "content_object"),
        ((gid, perms[codename], p) for (p, role), gid in group_of.items() for codename in ROLE_PERMISSIONS[role]),
    )
    User = get_user_model()
    u0 = next_id(User)
    users = sizes["users"]
    joined = NOW - YEAR
    copier.copy(
        User,
        ("id", "username", "password", "email", "is_active", "is_staff", "is_superuser", "date_joined"),
        (
            (u0 + i, f"fleet-user{i:05d}", "!", f"user{i}@fleet.example", True, False, False, joined)
            for i in range(users)
        ),
    )
    memberships: dict[int, dict[int, str]] = {}  # user -> project -> role
    for i, p in enumerate(fleet.project_ids):  # every project has an admin
        memberships.setdefault(u0 + i % users, {})[p] = Role.ADMIN
        fleet.admin_of[p] = u0 + i % users
    weights = (40, 25, 15, 10, 10)
    for u in range(u0, u0 + users):
        want = rng.choices(range(1, 6), weights)[0]
        mine = memberships.setdefault(u, {})
        while len(mine) < min(want, len(fleet.others)):
            p = rng.choice(fleet.others)
            mine.setdefault(p, Role.MEMBER if rng.random() < 0.8 else Role.VIEWER)
    member_id = u0 + users
    superuser_id = member_id + 1
    operator_ids = list(range(superuser_id + 1, superuser_id + 1 + OPERATORS))
    copier.copy(
        User,
        ("id", "username", "password", "is_active", "is_staff", "is_superuser", "date_joined"),
        [
            (member_id, MEMBER, "!", True, False, False, joined),
            (superuser_id, SUPERUSER, "!", True, True, True, joined),
            *((o, f"fleet-operator{k}", "!", True, True, False, joined) for k, o in enumerate(operator_ids)),
        ],
    )
    memberships[member_id] = {p: Role.MEMBER for p in fleet.member_project_ids}
    through = User.groups.through
    copier.copy(
        through,
        ("user", "group"),
        ((u, group_of[(p, role)]) for u, mine in memberships.items() for p, role in mine.items()),
    )
    operators.user_set.add(*operator_ids)


def _capacity(fleet: Fleet) -> None:
    sizes = fleet.sizes()
    copier = fleet.copier
    c0 = next_id(Cluster)
    clusters = sizes["clusters"]
    copier.copy(
        Cluster,
        ("id", "name", "kubeconfig_path", "status", "created_at", "last_success_at"),
        ((c0 + c, f"fleet-{c:02d}", "/dev/null", "ok", NOW - YEAR, NOW) for c in range(clusters)),
    )
    fleet.cluster_ids = list(range(c0, c0 + clusters))
    profiles = {(p.product, p.name): p for p in MigProfile.objects.all()}
    placements = {(pl.profile_id, pl.start): pl for pl in MigPlacement.objects.all()}
    nodes = sizes["nodes"]
    n0, g0, m0 = next_id(NodeCapacity), next_id(GpuCapacity), next_id(MigInstance)
    node_rows, gpu_rows, mig_rows = [], [], []
    units: list[Unit] = []
    for i in range(nodes):
        cluster = c0 + i * clusters // nodes
        catalog = "H100-80GB" if (cluster - c0) % 2 == 0 else "H200-141GB"
        name, memory, tier1, tier2 = PRODUCTS[catalog]
        shape = i % 10
        tier, mig, sharing, replicas = (
            ("full", "none", "", 1)
            if shape < 4
            else ("1", "mixed", "", 1)
            if shape < 6
            else ("2", "mixed", "", 1)
            if shape < 8
            else ("3", "none", "time-slicing", TIMESLICE_REPLICAS)
        )
        resource = "nvidia.com/gpu"
        allocatable = {resource: GPUS_PER_NODE * replicas} if mig == "none" else {}
        node_rows.append(
            (
                n0 + i, cluster, f"gpu-node-{i:05d}", name, GPUS_PER_NODE, memory, tier, mig, sharing, replicas, True,
                json.dumps({"nvidia.com/gpu.product": name.replace(" ", "-")}), json.dumps(allocatable),
                json.dumps(allocatable), NOW - YEAR, NOW,
            )
        )  # fmt: skip
        for index in range(GPUS_PER_NODE):
            gpu = g0 + i * GPUS_PER_NODE + index
            gpu_rows.append(
                (gpu, n0 + i, index, f"GPU-fleet-{gpu:08d}", name, catalog, memory, mig != "none", "ok", NOW)
            )
            if tier == "full":
                units.append(Unit(gpu, None, 0, "full", catalog, "", 7, resource, tier))
            elif tier == "3":
                units.extend(Unit(gpu, None, r, "timeslice", catalog, "", 7, resource, tier) for r in range(replicas))
            else:
                layout = [(tier1[0], 0), (tier1[1], 4)] if tier == "1" else [(tier2, s) for s in range(7)]
                for gi, (profile_name, start) in enumerate(layout):
                    profile = profiles[(catalog, profile_name)]
                    placement = placements[(profile.pk, start)]
                    mig_id = m0 + len(mig_rows)
                    mig_rows.append(
                        (mig_id, gpu, profile.pk, placement.pk, start, placement.size, gi + 1, 0,
                         f"MIG-fleet-{mig_id:08d}", "active", NOW - YEAR, NOW)
                    )  # fmt: skip
                    units.append(
                        Unit(
                            gpu,
                            mig_id,
                            0,
                            "mig",
                            catalog,
                            profile_name,
                            profile.compute_slices,
                            profile.resource_name,
                            tier,
                        )
                    )
    copier.copy(
        NodeCapacity,
        ("id", "cluster", "name", "gpu_product", "gpu_count", "gpu_memory_mib", "tier", "mig_strategy",
         "sharing_strategy", "timeslice_replicas", "ready", "labels", "capacity", "allocatable", "first_seen_at",
         "last_seen_at"),
        node_rows,
    )  # fmt: skip
    copier.copy(
        GpuCapacity,
        ("id", "node", "index", "uuid", "product", "catalog_product", "memory_mib", "mig_mode_current", "health",
         "last_seen_at"),
        gpu_rows,
    )  # fmt: skip
    copier.copy(
        MigInstance,
        ("id", "gpu", "profile", "placement", "placement_start", "placement_size", "gi_id", "ci_id", "uuid",
         "state", "first_seen_at", "last_seen_at"),
        mig_rows,
    )  # fmt: skip
    fleet.gpu_ids = [row[0] for row in gpu_rows]
    fleet._units = units  # consumed by _active
    fleet._node_cluster = {row[0]: row[1] for row in node_rows}
    fleet._gpu_node = {row[0]: row[1] for row in gpu_rows}


def _active(fleet: Fleet) -> None:
    """Active requests, pools and allocations over two thirds of the units; the queue; the member's own
    old requests, usage, statements and trespass events."""
    sizes = fleet.sizes()
    copier = fleet.copier
    units: list[Unit] = fleet.__dict__.pop("_units")
    gpu_node, node_cluster = fleet.__dict__.pop("_gpu_node"), fleet.__dict__.pop("_node_cluster")
    groups: dict[tuple, list[Unit]] = {}
    for k, unit in enumerate(units):
        if k % 3 != 2:
            key = (node_cluster[gpu_node[unit.gpu_id]], unit.kind, unit.product, unit.profile_name)
            groups.setdefault(key, []).append(unit)
    r0, pool0, a0 = next_id(PoolRequest), next_id(GpuPool), next_id(Allocation)
    projects = fleet.project_ids
    requests, pools, allocations = [], [], []
    for key, held in groups.items():
        cluster, kind, catalog, profile = key
        for start in range(0, len(held), POOL_UNITS):
            chunk = held[start : start + POOL_UNITS]
            j = len(pools)
            project = projects[j % len(projects)]
            created = NOW - dt.timedelta(days=1 + j % 60, minutes=j % 1440)
            rid, pid = r0 + j, pool0 + j
            requests.append(
                request_row(rid, project, fleet.admin_of[project], "active", kind, catalog, profile, len(chunk),
                             cluster, created, approved=True)
            )  # fmt: skip
            tier = requests[-1][5]
            pools.append(
                (pid, project, rid, cluster, f"pool-{pid}", requests[-1][-1], tier, "active", created, created, None)
            )
            for unit in chunk:
                allocations.append(
                    (a0 + len(allocations), pid, project, unit.kind, unit.replica, unit.resource_name, unit.product,
                     unit.profile_name, unit.compute_slices, unit.gpu_id, unit.mig_instance_id, created, None, None)
                )  # fmt: skip
    # The queue: requests waiting for capacity, with their entries.
    q0 = r0 + len(requests)
    queued = []
    for k in range(sizes["queued"]):
        project = projects[(k * 7) % len(projects)]
        queued.append(
            request_row(q0 + k, project, fleet.admin_of[project], "queued", "full", "H100-80GB", "",
                         1 + k % 8, None, NOW - dt.timedelta(minutes=k), approved=False)
        )  # fmt: skip
    # The member's own history: old released requests, the oldest rows of all.
    m0 = q0 + len(queued)
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    mine = [
        request_row(m0 + k, p, fleet.admin_of[p], "released", "full", "H100-80GB", "", 1, None,
                     old + dt.timedelta(hours=k))
        for k, p in enumerate(p for p in fleet.member_project_ids for _ in range(MEMBER_OLD_REQUESTS))
    ]  # fmt: skip
    copier.copy(PoolRequest, REQUEST_FIELDS, requests + queued + mine)
    copier.copy(GpuPool, POOL_FIELDS, pools)
    copier.copy(Allocation, ALLOCATION_FIELDS, allocations)
    copier.copy(QueueEntry, ("request", "queued_at"), ((row[0], row[11]) for row in queued))
    fleet.history_base["request"] = m0 + len(mine)
    fleet.history_base["count"] = max(0, sizes["requests"] - len(requests) - len(queued) - len(mine))
    fleet.history_base["pool"] = pool0 + len(pools)
    fleet.history_base["allocation"] = a0 + len(allocations)
    # Usage subjects: every allocation of the member's projects, and USAGE_ALLOCATIONS of the others'.
    member = set(fleet.member_project_ids)
    theirs = [a for a in allocations if a[2] not in member]
    step = max(1, len(theirs) // sizes["usage_allocations"])
    subjects = lambda rows: [(a[0], a[1], a[2], a[3], a[6], a[7]) for a in rows]  # noqa: E731
    fleet.usage_allocations = subjects(theirs[::step][: sizes["usage_allocations"]])
    _usage(fleet, subjects([a for a in allocations if a[2] in member]))
    _statements(fleet, fleet.member_project_ids)
    _trespass(fleet, range(len(fleet.member_project_ids) * MEMBER_TRESPASS), owners=fleet.member_project_ids)


def _usage(fleet: Fleet, subjects, hours: range = range(HOURS)) -> None:
    def rows() -> Iterator[tuple]:
        for h in hours:
            hour = MONTH + dt.timedelta(hours=h)
            for allocation, pool, project, kind, product, profile in subjects:
                replicas = TIMESLICE_REPLICAS if kind == "timeslice" else 1
                yield (hour, allocation, pool, project, kind, product, profile, replicas, 3600, HOURLY_RATE[kind])

    fleet.copier.copy(
        UsageRecord,
        ("hour", "allocation", "pool", "project", "kind", "product", "profile_name", "replicas", "seconds",
         "hourly_rate"),
        rows(),
    )  # fmt: skip


def _statements(fleet: Fleet, projects: Iterable[int]) -> None:
    months = []
    year, month = MONTH.year, MONTH.month
    for _ in range(STATEMENT_MONTHS):
        months.append(dt.date(year, month, 1))
        year, month = (year, month - 1) if month > 1 else (year - 1, 12)

    def rows() -> Iterator[tuple]:
        for p in projects:
            for k, period in enumerate(months):
                amount = Decimal(100 + (p * 37 + k * 11) % 900)
                generated = dt.datetime.combine(period, dt.time(), dt.UTC) + dt.timedelta(days=32)
                state = "draft" if k == 0 else "finalised"
                yield (p, period, state, "USD", Decimal(amount / 2), amount, amount, generated,
                       generated if state == "finalised" else None)  # fmt: skip

    fleet.copier.copy(
        Statement,
        ("project", "period", "state", "currency", "reserved_hours", "reserved_amount", "total_amount",
         "generated_at", "finalised_at"),
        rows(),
    )  # fmt: skip


def _trespass(fleet: Fleet, indexes: Iterable[int], *, owners: list[int]) -> None:
    """Ended foreign-pod events on full GPUs: event k on owners[k % len] by another project's pod."""
    gpus, projects = fleet.gpu_ids, fleet.project_ids

    def rows() -> Iterator[tuple]:
        for k in indexes:
            gpu = gpus[(k * 13) % len(gpus)]
            owner = owners[k % len(owners)]
            trespasser = projects[-1 - k % (len(projects) - MEMBER_PROJECTS)]
            started = NOW - dt.timedelta(minutes=5 * (k + 1))
            yield (
                "foreign_pod",
                gpu,
                f"gpu:{gpu}",
                owner,
                trespasser,
                f"f{trespasser:05d}",
                f"pod-{k}",
                f"uid-fleet-{k}",
                started,
                started + dt.timedelta(minutes=3),
                started + dt.timedelta(minutes=3),
            )
        # fmt: skip

    fleet.copier.copy(
        TrespassEvent,
        ("kind", "gpu", "unit_key", "owner_project", "project", "namespace", "pod_name", "pod_uid", "started_at",
         "last_seen_at", "ended_at"),
        rows(),
    )  # fmt: skip


def grow(fleet: Fleet, to: float, *, stdout=None) -> dict[str, int]:
    """Add others' history from the fraction already grown up to `to` (0..1) of its full size.

    History row k is the same row whichever slices build it, so grow(0.01) then grow(1) equals grow(1)."""
    sizes = fleet.sizes()
    start, stop = fleet.grown, to
    if stop <= start:
        return {}
    started = time.perf_counter()
    before = dict(fleet.copier.counts)
    others = fleet.others
    base = fleet.history_base
    total = base["count"]
    lo, hi = int(start * total), int(stop * total)
    with transaction.atomic():
        requests, pools, allocations = [], [], []
        for k in range(lo, hi):
            project = others[(k * 7919) % len(others)]
            created = NOW - dt.timedelta(seconds=int(YEAR.total_seconds() * (k % 997) / 997) + k % 3600)
            pooled = k % 4 == 0
            state = "released" if pooled else HISTORY_STATES[k % len(HISTORY_STATES)]
            requests.append(
                request_row(base["request"] + k, project, fleet.admin_of[project], state, "full", "H100-80GB", "", 1,
                             None, created, approved=state in ("released", "expired"))
            )  # fmt: skip
            if pooled:
                pid = base["pool"] + k // 4
                ended = created + dt.timedelta(days=1)
                pools.append(
                    (pid, project, base["request"] + k, fleet.cluster_ids[0], f"pool-{pid}", "training", "full",
                     "released", created, created, ended)
                )  # fmt: skip
                gpu = fleet.gpu_ids[k % len(fleet.gpu_ids)]
                allocations.append(
                    (base["allocation"] + k // 4, pid, project, "full", 0, "nvidia.com/gpu", "H100-80GB", "", 7, gpu,
                     None, created, ended, ended)
                )  # fmt: skip
        fleet.copier.copy(PoolRequest, REQUEST_FIELDS, requests)
        fleet.copier.copy(GpuPool, POOL_FIELDS, pools)
        fleet.copier.copy(Allocation, ALLOCATION_FIELDS, allocations)
        # Usage: the same slice of the month's hours for the others' usage subjects.
        _usage(fleet, fleet.usage_allocations, range(int(start * HOURS), int(stop * HOURS)))
        n = len(others)
        _statements(fleet, others[int(start * n) : int(stop * n)])
        _trespass(fleet, range(int(start * sizes["trespass"]), int(stop * sizes["trespass"])), owners=others)
    reset_sequences(_ALL)
    analyze(_ALL)
    fleet.grown = stop
    added = {t: fleet.copier.counts[t] - before.get(t, 0) for t in fleet.copier.counts}
    fleet.build_s[f"grow_{stop:g}"] = round(time.perf_counter() - started, 2)
    if stdout is not None:
        stdout.write(f"fleet: history grown to {stop:.0%} in {fleet.build_s[f'grow_{stop:g}']} s\n")
    return {t: v for t, v in added.items() if v}


_ALL = (
    Project, Group, get_user_model(), get_user_model().groups.through, Cluster, NodeCapacity, GpuCapacity,
    MigInstance, PoolRequest, GpuPool, Allocation, QueueEntry, UsageRecord, Statement, TrespassEvent,
    ProjectGroupObjectPermission,
)  # fmt: skip
