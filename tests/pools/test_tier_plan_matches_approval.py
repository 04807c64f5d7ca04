"""The live tier plan counts what approval hands out, tier by tier (issue #30's "Done when").

For each tier, and for each kind of unit the fleet's inventory shows (every MIG profile, whole GPUs,
time-slice replicas, MPS clients, vGPU types; the smallest first), requests of count 1 are approved until
approval refuses. The units handed out, counted by their node's tier, must equal the plan's free units of
that tier; afterwards the plan shows them reserved and nothing free. The specs to try come from the raw
inventory, never from the plan, so a plan that counted a unit approval refuses (a 1g slice on a tier-1 node,
a vm-vgpu node's GPU as a whole GPU) or missed one approval gives fails here.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from pool_world import Fleet
from tier_fleets import NodeSpec, build_fleet, fleets

from capacity.choices import SpecKind, Tier
from capacity.models import GpuCapacity, MigInstance, NodeCapacity, SpecAndCount, WorkloadProfile
from capacity.services.planning import tier_plan
from capacity.vgpu import VGPU_TYPES
from pools import services
from pools.choices import Isolation
from pools.exceptions import InsufficientCapacity
from pools.models import Allocation, PoolRequest

pytestmark = pytest.mark.django_db


def inventory_specs() -> list[dict]:
    """Every kind of unit the raw inventory shows, as request fields, the smallest first (not from the plan)."""
    found: list[tuple] = []
    for product, name, slices in (
        MigInstance.objects.present()
        .values_list("profile__product", "profile__name", "profile__compute_slices")
        .distinct()
    ):
        found.append((slices, {"spec_kind": SpecKind.MIG, "isolation": Isolation.MIG, "product": product}, name))
    present = GpuCapacity.objects.present()
    for product in present.filter(mig_mode_current=False).values_list("catalog_product", flat=True).distinct():
        found.append((8, {"spec_kind": SpecKind.FULL, "isolation": Isolation.FULL, "product": product}, ""))
        for kind, isolation in ((SpecKind.TIMESLICE, Isolation.TIMESLICE), (SpecKind.MPS, Isolation.MPS)):
            fields = {"spec_kind": kind, "isolation": isolation, "product": product}
            found.append((0, fields, ""))
    for name in SpecAndCount.objects.filter(kind=SpecKind.VGPU).values_list("profile_name", flat=True).distinct():
        vgpu = VGPU_TYPES[name]
        fields = {"spec_kind": SpecKind.VGPU, "isolation": Isolation.VGPU, "product": vgpu.product}
        found.append((1, fields, name))
    return [{**fields, "profile_name": name} for _, fields, name in sorted(found, key=lambda f: (f[0], str(f[1:])))]


def drain(project, operator) -> Counter:
    """For each tier, approve the smallest request of each kind the inventory shows, one unit at a time,
    until refused; the units handed out per tier of the node they are on."""
    specs = inventory_specs()
    for tier in Tier.values:
        for fields in specs:
            while True:
                request = PoolRequest.objects.create(project=project, state="submitted", tier=tier, count=1, **fields)
                try:
                    services.approve(request, actor=operator)
                except InsufficientCapacity:
                    request.delete()
                    break
    rows = Allocation.objects.active().values("gpu__node__tier").annotate(n=Count("pk"))
    return Counter({r["gpu__node__tier"]: r["n"] for r in rows.order_by()})


def heal() -> None:
    """Every node ready and uncordoned, every GPU healthy, every pod gone: what was unavailable is free."""
    NodeCapacity.objects.update(ready=True, cordoned=False)
    GpuCapacity.objects.update(health="ok")
    WorkloadProfile.objects.running().update(ended_at=timezone.now())


def assert_plan_is_what_approval_hands_out(project, operator) -> dict:
    """Drain: approval hands out each tier's free units. Heal and drain again: with the rest, its total."""
    before = tier_plan()
    handed = drain(project, operator)
    after = tier_plan()
    for tier in Tier.values:
        was, now = before.tier(tier), after.tier(tier)
        assert handed[tier] == (was.free if was else 0), (tier, before.as_dict())
        if was is None:
            continue
        assert (now.total, now.free, now.reserved) == (was.total, 0, was.reserved + handed[tier])
        assert now.withheld == was.withheld
    heal()
    total = drain(project, operator)  # every allocation held now, both rounds'
    for tier in Tier.values:
        was = before.tier(tier)
        assert total[tier] == (was.total - was.reserved if was else 0), (tier, before.as_dict())
    return {"before": before, "handed": handed}


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # no shrinking: each example drains a fleet
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fleet=fleets)
def test_random_fleets_plan_equals_approval(fleet, project, operator):
    with transaction.atomic():
        build_fleet(Fleet(), fleet)
        result = assert_plan_is_what_approval_hands_out(project, operator)
        clean = not any(n.state != "ok" for n in fleet["nodes"])
        if clean:  # nothing cordoned or unhealthy, nothing held: every unit of the plan is handed out at once
            for figures in result["before"].tiers:
                assert result["handed"][figures.tier] == figures.total
        transaction.set_rollback(True)


def test_a_fixed_mixed_fleet(project, operator):
    """The cases the random fleets may miss, all at once: a 1g/2g layout on tier 1 (withheld), vGPU on tier 2,
    MPS and time-slicing on tier 3, whole GPUs on training and (never handed out) on tier 1."""
    nodes = [
        NodeSpec(0, "H100-80GB", "1", "mig", 2, (1, 0), 2, 0, "ok"),
        NodeSpec(0, "H100-80GB", "2", "vgpu", 1, (0, 0), 2, 1, "ok"),
        NodeSpec(1, "H200-141GB", "3", "mps", 1, (0, 0), 3, 0, "ok"),
        NodeSpec(1, "A100-40GB", "3", "timeslice", 1, (0, 0), 2, 0, "ok"),
        NodeSpec(1, "H200-141GB", "full", "full", 2, (0, 0), 2, 0, "ok"),
        NodeSpec(0, "H100-80GB", "1", "full", 1, (0, 0), 2, 0, "ok"),
    ]
    build_fleet(Fleet(), {"nodes": nodes, "pad": (1, 2), "tier2_min": 1})
    plan = tier_plan(reserve_gpus=1)
    tier1, tier2, tier3, full = (plan.tier(t) for t in ("1", "2", "3", "full"))
    # Tier 1: GPU 0 is 3g + 2g + 1g + 1g (only the 3g admitted), GPU 1 is 4g + 3g; the whole GPU is unserved.
    assert (tier1.gpus, tier1.total, tier1.withheld, tier1.unserved_gpus, tier1.reserve) == (3, 3, 3, 1, 2)
    assert (tier2.total, [(s.kind, s.spec, s.per_gpu) for s in tier2.specs]) == (4, [("vgpu", "H100XM-20C", 4)])
    assert sorted((s.kind, s.product, s.total) for s in tier3.specs) == [
        ("mps", "H200-141GB", 3),
        ("timeslice", "A100-40GB", 2),
    ]
    assert (tier3.total, tier3.reserve) == (5, 3)  # per cluster: the GPU that carries the most (3 MPS clients)
    assert (full.total, full.free_after_reserve) == (2, 1)
    result = assert_plan_is_what_approval_hands_out(project, operator)
    assert dict(result["handed"]) == {"1": 3, "2": 4, "3": 5, "full": 2}


def test_the_demo_fleet(sim, project, operator):
    """The demo's simulated clusters (simcluster/scenarios/demo.yaml), discovered: tier 1 is 2 nodes x 8 H100 in
    the all-balanced layout (1g + 1g + 2g + 3g, only the 3g admitted), tier 2 4g + 3g on GPUs 0-5 and
    3g + 2g + 1g + 1g on 6-7 of 2 nodes, training 2 x 8 whole H100s, tier 3 2 x 8 H200s time-sliced 4 ways."""
    plan = tier_plan()
    figures = {t.tier: (t.gpus, t.total, t.withheld, t.reserve) for t in plan.tiers}
    assert figures == {"1": (16, 16, 48, 1), "2": (16, 40, 0, 4), "3": (16, 64, 0, 4), "full": (16, 16, 0, 1)}
    # The scenario's own pods hold units approval cannot give out: the tracker's 3g and the segmenter's 4g
    # (scheduled on tier 2), the training job's 4 whole GPUs; the detector's 1g on tier 1 is withheld by the
    # policy, busy or not; replicas are handed out by count, so the notebooks' are not withheld.
    unavailable = {t.tier: t.unavailable for t in plan.tiers}
    assert unavailable == {"1": 0, "2": 2, "3": 0, "full": 4}
    result = assert_plan_is_what_approval_hands_out(project, operator)
    assert dict(result["handed"]) == {"1": 16, "2": 38, "3": 64, "full": 12}


def test_a_vgpu_node_counts_as_its_configured_type_not_its_first_advertised(project, operator):
    """A vm-vgpu node configured (nvidia.com/vgpu.config) for H100XM-40C whose device plugin still advertises
    H100XM-20C too (listed first): discovery records the configured type, the plan counts 2 x 2 vGPUs of it and
    approval hands out exactly those. Once the label names another type (set_vgpu_config, before discovery saw
    the device manager recreate the vGPUs) neither the plan nor approval counts the old type's vGPUs."""
    nodes = [NodeSpec(0, "H100-80GB", "2", "vgpu", 2, (0, 0), 2, 0, "ok")]
    build_fleet(Fleet(), {"nodes": nodes, "pad": (0, 0), "tier2_min": 1})
    node = NodeCapacity.objects.get(name="c-n0-vgpu")
    assert list(node.specs.values_list("kind", "profile_name", "replicas")) == [("vgpu", "H100XM-40C", 2)]
    tier2 = tier_plan().tier("2")
    assert [(s.kind, s.spec, s.per_gpu, s.total) for s in tier2.specs] == [("vgpu", "H100XM-40C", 2, 4)]
    assert (tier2.total, tier2.unserved_gpus) == (4, 0)
    result = assert_plan_is_what_approval_hands_out(project, operator)
    assert dict(result["handed"]) == {"2": 4}
    assert set(Allocation.objects.active().values_list("profile_name", flat=True)) == {"H100XM-40C"}

    Allocation.objects.all().delete()
    node.labels = {**node.labels, "nvidia.com/vgpu.config": "H100XM-20C"}
    node.save(update_fields=["labels"])
    tier2 = tier_plan().tier("2")
    assert (tier2.total, tier2.unserved_gpus, tier2.specs) == (0, 2, [])
    assert dict(drain(project, operator)) == {}

    # The device manager reports the change failed: the 40C vGPUs stay, and are offered again.
    node.labels = {**node.labels, "nvidia.com/vgpu.config.state": "failed"}
    node.save(update_fields=["labels"])
    assert [(s.spec, s.total) for s in tier_plan().tier("2").specs] == [("H100XM-40C", 4)]
    assert dict(drain(project, operator)) == {"2": 4}
