"""The project view's reads: a member's projects, their pools as cards, requests, allocations and costs.

Everything is scoped with tenancy.roles.projects_for(user) (one subquery): a member never sees a row
of another project. Pool cards come from GpuPool.objects.with_card(), the same figures as the API. The
request form's "Check availability" is availability_check(), approval's own answer (units.verdict).
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from django.db.models import Count, Q

from capacity.choices import SHARED_SPEC_KINDS, SpecKind
from capacity.models import Cluster
from monitoring.readers.cards import with_utilisation
from pools.models import Allocation, BestEffortRequest, GpuPool, PoolRequest, gpu_count
from pools.units import shortage, verdict
from tenancy.models import Project
from tenancy.roles import projects_for

from .status import HELD_SHAPE_LABELS, HELD_SHAPES, SHAPES, UnitStatus, gpus_text, held_shape

REQUESTS_SHOWN = 50


def visible_projects(user):
    """The user's projects (all of them for an operator), with how many pools each holds."""
    return (
        projects_for(user)
        .annotate(pools_held=Count("pools", filter=Q(pools__released_at__isnull=True)))
        .order_by("slug")
    )


def held_pools(projects):
    return GpuPool.objects.held().filter(project__in=projects)


def pool_cards(pools) -> list[dict]:
    """The seed's pool cards for a queryset of pools. Two queries (the pools, then their clusters).

    GPUs are counted as shares of a GPU (GpuPool.card()); `gpus_touched` is labelled as such wherever it shows.
    A pool across clusters is one card: its units per cluster (`c1 4, c2 1`) and each cluster's
    provisioning (PoolCluster.state); `cluster` stays the home cluster (GpuPool.cluster), as in the API.
    """
    pools = (
        with_utilisation(pools.with_card())
        .with_clusters()
        .with_shares()
        .select_related("project", "cluster", "request")
        .order_by("project__slug", "-created_at", "-id")
    )
    cards = []
    for pool in pools:
        card = pool.card()
        utilisation = card["utilisation"]
        cards.append(
            card
            | {
                "id": pool.pk,
                "project": pool.project.slug,
                "project_name": pool.project.name,
                "cluster": pool.cluster.name,
                "clusters": [
                    {
                        "name": part.cluster.name,
                        "units": part.units_held,
                        "state": part.state.value,
                        "state_label": part.state.label,
                        "error": part.error,
                    }
                    for part in pool.pool_clusters.all()
                ],
                "units_per_cluster": pool.units_per_cluster(),
                "state": pool.state,
                "state_label": pool.get_state_display(),
                "workload_type": pool.get_workload_type_display(),
                "utilisation_pct": None if utilisation is None else round(100 * float(utilisation), 1),
                "total_gpus_text": gpus_text(card["total_gpus"]),
                "in_use_gpus_text": gpus_text(card["in_use_gpus"]),
            }
        )
    return cards


def recent_requests(projects) -> list[PoolRequest]:
    return list(
        PoolRequest.objects.filter(project__in=projects)
        .select_related("project", "queue_entry")
        .order_by("-created_at", "-id")[:REQUESTS_SHOWN]
    )


def best_effort_requests(projects) -> list[BestEffortRequest]:
    """The projects' best-effort requests, open ones first, with the lent units each holds now."""
    return list(
        BestEffortRequest.objects.filter(project__in=projects)
        .select_related("project")
        .with_units_held()
        .order_by("-state", "-created_at", "-id")[:REQUESTS_SHOWN]  # "open" sorts before "ended" descending
    )


def _annotated_allocations(queryset):
    """Active allocations with `busy` (a workload runs on the unit)."""
    return queryset.active().annotate_busy()


def profile_distribution(allocations) -> list[dict]:
    """Rows 1g..7g, Full, then Time-slice and vGPU when held: the held units in use and ready (held but
    idle), and the GPUs they make, each unit counted as its share of a GPU (GpuPool.card()'s rule). One query."""
    counts = {shape: {UnitStatus.IN_USE.value: 0, UnitStatus.READY.value: 0} for shape in HELD_SHAPES}
    gpus = dict.fromkeys(HELD_SHAPES, Fraction(0))
    held = _annotated_allocations(allocations).counted("kind", "mig_instance__profile__compute_slices", "busy")
    for (kind, slices, busy), (units, share) in held.items():
        shape = held_shape(kind, slices)
        counts[shape][UnitStatus.IN_USE if busy else UnitStatus.READY] += units
        gpus[shape] += share
    return [
        {
            "shape": shape,
            "label": HELD_SHAPE_LABELS[shape],
            **counts[shape],
            "total": sum(counts[shape].values()),
            "gpus": gpu_count(gpus[shape]),
            "gpus_text": gpus_text(gpu_count(gpus[shape])),
        }
        for shape in HELD_SHAPES
        if shape in SHAPES or sum(counts[shape].values())
    ]


def pool_allocations(pool: GpuPool) -> dict:
    """A pool's allocation tab: its units with node, GPU and status, the per-node profile counts, and the units
    that ended and are being emptied (`ending`, with when their pods are evicted). Two queries."""
    rows = list(
        _annotated_allocations(Allocation.objects.filter(pool=pool))
        .select_related("gpu__node__cluster", "mig_instance__profile")
        .order_by("gpu__node__name", "gpu__index", "mig_instance__placement_start", "replica")
    )
    units = []
    by_node: dict[str, dict[str, dict[str, int]]] = defaultdict(
        lambda: {shape: {UnitStatus.IN_USE.value: 0, UnitStatus.READY.value: 0} for shape in HELD_SHAPES}
    )
    for allocation in rows:
        instance = allocation.mig_instance
        shape = held_shape(allocation.kind, instance.profile.compute_slices if instance else None)
        status = UnitStatus.IN_USE if allocation.busy else UnitStatus.READY
        node = allocation.gpu.node
        by_node[f"{node.cluster.name}/{node.name}"][shape][status] += 1
        units.append(
            {
                "id": allocation.pk,
                "cluster": node.cluster.name,
                "node": node.name,
                "gpu_index": allocation.gpu.index,
                "gpu_uuid": allocation.gpu.uuid,
                "product": allocation.product,
                "kind": allocation.get_kind_display(),
                "profile": allocation.profile_name or ("full GPU" if allocation.kind == SpecKind.FULL else ""),
                "replica": allocation.replica if allocation.kind in SHARED_SPEC_KINDS else None,
                "placement": f"{instance.placement_start}:{instance.placement_size}" if instance else "",
                "shape": shape,
                "shape_label": HELD_SHAPE_LABELS[shape],
                "status": status.value,
                "status_label": status.label,
                "allocated_at": allocation.allocated_at,
            }
        )
    nodes = [
        {
            "node": name,
            "shapes": [
                {"shape": shape, "label": HELD_SHAPE_LABELS[shape], **counts}
                for shape, counts in shapes.items()
                if sum(counts.values())
            ],
        }
        for name, shapes in sorted(by_node.items())
    ]
    in_use = sum(1 for u in units if u["status"] == UnitStatus.IN_USE)
    # The in-app notice of units that ended and are being emptied (pools/ending.py): when their pods go.
    ended = Allocation.objects.filter(pool=pool).ending().select_related("gpu__node").order_by("released_at", "pk")
    ending = [
        {"id": a.pk, "node": a.gpu.node.name, "profile": a.profile_name or a.get_kind_display(), "at": a.evict_after}
        for a in ended
    ]
    return {"units": units, "nodes": nodes, "in_use": in_use, "ready": len(units) - in_use, "ending": ending}


def project_of_user(user, slug: str) -> Project | None:
    return projects_for(user).filter(slug=slug).first()


def availability_check(draft: PoolRequest) -> dict:
    """What approval would do with an unsaved request (units.verdict, the answer approval, the dry run and the
    forecast give): free units per cluster, those the tier policy withholds, and the shortage sentence when no
    cluster has enough. A spec no unit would ever serve never gets here: the form refuses it."""
    found = verdict(draft)
    free = found.free_by_cluster
    names = dict(Cluster.objects.filter(pk__in=free).values_list("pk", "name"))
    clusters = [{"name": names[pk], "free": n} for pk, n in sorted(free.items(), key=lambda kv: names[kv[0]])]
    return {
        "spec": found.spec,
        "need": found.need,
        "clusters": clusters,
        "enough": found.fits,
        "withheld": found.withheld_sentence(),
        "message": "" if found.fits else shortage(draft, free)[0],
    }
