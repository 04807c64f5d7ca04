"""The fleet world's shape: its sizes at scale 1 (issue #28), the dates it spans, and the Fleet and Unit records
that building it fills in."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

from .copier import Copier

# Sizes at scale 1 (issue #28).
CLUSTERS = 10
NODES = 12_500
GPUS_PER_NODE = 8
PROJECTS = 10_000
USERS = 20_000
OPERATORS = 10
REQUESTS = 1_000_000
QUEUED = 10_000
TRESPASS = 100_000
USAGE_ALLOCATIONS = 2_000  # others' allocations with a month of hourly usage (see the module docstring)
STATEMENT_MONTHS = 12
POOL_UNITS = 10
MEMBER_PROJECTS = 3
MEMBER_OLD_REQUESTS = 30
MEMBER_TRESPASS = 20
MEMBER = "fleet-member"
SUPERUSER = "fleet-superuser"

MONTH = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
HOURS = 720
NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
YEAR = dt.timedelta(days=365)
PRODUCTS = {  # catalog product: (NVML product name, memory MiB, tier-1 profiles, tier-2 profile)
    "H100-80GB": ("NVIDIA H100 80GB HBM3", 81559, ("4g.40gb", "3g.40gb"), "1g.10gb"),
    "H200-141GB": ("NVIDIA H200", 143771, ("4g.71gb", "3g.71gb"), "1g.18gb"),
}
HISTORY_STATES = ("released", "expired", "rejected", "withdrawn", "released", "failed", "released", "expired")
TIMESLICE_REPLICAS = 4
HOURLY_RATE = {"full": Decimal("2.500000"), "mig": Decimal("0.450000"), "timeslice": Decimal("0.600000")}


def scaled(n: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, round(n * scale))


@dataclass
class Unit:
    gpu_id: int
    mig_instance_id: int | None
    replica: int
    kind: str
    product: str
    profile_name: str
    compute_slices: int
    resource_name: str
    tier: str


@dataclass
class Fleet:
    """What the builder made and what grow() and the measurements need to know about it."""

    scale: float
    seed: int = 28
    project_ids: list[int] = field(default_factory=list)
    member_project_ids: list[int] = field(default_factory=list)
    admin_of: dict[int, int] = field(default_factory=dict)  # project id -> its admin's user id
    gpu_ids: list[int] = field(default_factory=list)
    usage_allocations: list[tuple[int, int, int, str, str, str]] = field(default_factory=list)
    cluster_ids: list[int] = field(default_factory=list)
    history_base: dict[str, int] = field(default_factory=dict)
    grown: float = 0.0
    copier: Copier = field(default_factory=Copier)
    build_s: dict[str, float] = field(default_factory=dict)

    @property
    def others(self) -> list[int]:
        return self.project_ids[MEMBER_PROJECTS:]

    def sizes(self) -> dict[str, int]:
        return {
            "clusters": min(CLUSTERS, scaled(NODES, self.scale)),
            "nodes": scaled(NODES, self.scale, CLUSTERS),
            "projects": scaled(PROJECTS, self.scale, MEMBER_PROJECTS + 2),
            "users": scaled(USERS, self.scale, 4),
            "requests": scaled(REQUESTS, self.scale, 100),
            "queued": scaled(QUEUED, self.scale, 2),
            "trespass": scaled(TRESPASS, self.scale, 10),
            "usage_allocations": scaled(USAGE_ALLOCATIONS, self.scale, 2),
        }


# Rows of the COPY into pools' tables: a pool request, and the fields of requests, pools and allocations.
def request_row(rid, project, user, state, kind, catalog, profile, count, cluster, created, *, approved=False):
    isolation = {"full": "full", "mig": "mig", "timeslice": "timeslice"}[kind]
    tier = {"full": "full", "mig": "2", "timeslice": "3"}[kind]
    return (
        rid, project, user, state, isolation, tier, kind, catalog, profile, count, cluster, created, created,
        created, created if approved else None, "training" if kind == "full" else "development",
    )  # fmt: skip


REQUEST_FIELDS = (
    "id", "project", "requested_by", "state", "isolation", "tier", "spec_kind", "product", "profile_name", "count",
    "cluster", "start_at", "created_at", "updated_at", "approved_at", "workload_type",
)  # fmt: skip
POOL_FIELDS = (
    "id", "project", "request", "cluster", "name", "workload_type", "tier", "state", "created_at", "provisioned_at",
    "released_at",
)  # fmt: skip
ALLOCATION_FIELDS = (
    "id", "pool", "project", "kind", "replica", "resource_name", "product", "profile_name", "compute_slices",
    "gpu", "mig_instance", "allocated_at", "released_at", "vacated_at",
)  # fmt: skip
