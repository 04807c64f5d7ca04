"""Rebalancing respects the tier profile policy: a GPU is only ever given profiles its node's tier allows
(tier 1: 3g and larger, tier 3: only 1g/2g by default; TierProfilePolicy rows over that), the tier being the
node's TierAssignment where gpuaas owns it."""

from collections import Counter

import pytest
from reconfig_sim import mig_demand, start_sim

from capacity import tiers
from capacity.mig.planner import GpuState, plan_onto_gpus
from capacity.models import NodeCapacity, TierProfilePolicy
from capacity.services.tiers import assign_tier
from operations import rebalancing

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(
        tmp_path,
        [
            ("sla-1", "H100-80GB", 1, {0: ["7g.80gb"]}, "infer"),
            ("dev-3", "H100-80GB", 1, {0: ["7g.80gb"]}, "dev"),
        ],
    )
    assign_tier(NodeCapacity.objects.get(name="sla-1"), "1")
    assign_tier(NodeCapacity.objects.get(name="dev-3"), "3")
    yield sim
    sim.server.stop()


def _demand(sim, **units):
    mig_demand(sim.cluster, **units)


def _profiles(proposal) -> dict[str, Counter]:
    return {
        node: Counter(p["profile"] for layout in gpus.values() for p in layout)
        for node, gpus in proposal.targets_by_node().items()
    }


def test_small_slices_go_to_the_development_node_only(sim):
    _demand(sim, **{"1g_10gb": 14})  # two GPUs' worth: without the policy both would be carved into 1g
    proposal = rebalancing.propose_rebalance(sim.cluster, "H100-80GB", days=30)
    assert _profiles(proposal) == {"dev-3": Counter({"1g.10gb": 7})}
    assert proposal.plan.unmet == {"1g.10gb": 7}


def test_large_slices_never_land_on_the_development_node(sim):
    _demand(sim, **{"3g_40gb": 4})
    proposal = rebalancing.propose_rebalance(sim.cluster, "H100-80GB", days=30)
    assert _profiles(proposal) == {"sla-1": Counter({"3g.40gb": 2})}
    assert proposal.plan.unmet == {"3g.40gb": 2}


def test_an_operators_policy_row_is_what_the_plan_follows(sim):
    TierProfilePolicy.objects.filter(tier="1").update(min_compute_slices=1, max_compute_slices=8)  # tier 1: any size
    _demand(sim, **{"1g_10gb": 14})
    proposal = rebalancing.propose_rebalance(sim.cluster, "H100-80GB", days=30)
    assert _profiles(proposal) == {"dev-3": Counter({"1g.10gb": 7}), "sla-1": Counter({"1g.10gb": 7})}


def test_the_tier_assignment_wins_over_a_tier_that_drifted(sim):
    NodeCapacity.objects.filter(name="sla-1").update(tier="3")  # the label said 3 before gpuaas restored it
    _demand(sim, **{"1g_10gb": 14})
    proposal = rebalancing.propose_rebalance(sim.cluster, "H100-80GB", days=30)
    assert "sla-1" not in _profiles(proposal)


def test_the_planners_heuristic_keeps_to_each_gpus_allowed_profiles():
    """A fleet too large for the exact search: patterns and greedy steps alike respect `allowed`."""
    large = frozenset(tiers.allowed_profiles("1", "H100-80GB"))
    small = frozenset(tiers.allowed_profiles("3", "H100-80GB"))
    gpus = [GpuState(f"g{i}", allowed=large if i % 2 else small) for i in range(40)]
    demand = {"1g.10gb": 40, "2g.20gb": 12, "3g.40gb": 16, "4g.40gb": 6, "7g.80gb": 3}
    plan = plan_onto_gpus("H100-80GB", gpus, demand)
    assert not plan.exact
    allowed = {g.gpu: g.allowed for g in gpus}
    created = [(c.gpu, p.profile) for c in plan.changes for p in c.create]
    assert created and all(profile in allowed[gpu] for gpu, profile in created)
    assert plan.met.get("1g.10gb", 0) > 0 and plan.met.get("3g.40gb", 0) > 0
