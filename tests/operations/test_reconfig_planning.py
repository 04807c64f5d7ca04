"""Capacity planning (slots per tier) and the rebalancing proposal for the next maintenance window."""

from datetime import timedelta

import pytest
from django.utils import timezone
from reconfig_sim import allocate, drive, gpu_row, mig_demand, start_sim

from capacity.models import MaintenanceWindow, MigReconfiguration
from capacity.services import planning
from operations import rebalancing
from pools.models import PoolRequest
from tenancy.models import Project

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(
        tmp_path,
        [
            ("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"], 1: ["7g.80gb"]}, "infer"),
            ("gpu-b", "H100-80GB", 2, None, "train"),
        ],
    )
    yield sim
    sim.server.stop()


def test_current_plan_counts_each_gpu_as_it_is_used(sim):
    plan = planning.current_capacity_plan(cluster=sim.cluster)
    assert plan["gpus"] == 4
    assert [(g["tier"], g["use"], g["gpus"], g["layout"], g["slots"]) for g in plan["groups"]] == [
        ("", "mig", 1, ["3g.40gb", "3g.40gb"], 2),
        ("", "mig", 1, ["7g.80gb"], 1),
        ("", "full", 2, None, 2),
    ]
    assert [g["gpus"] for g in planning.current_capacity_plan(node_group="train")["groups"]] == [2]
    # The same GPUs in the live plan: untiered nodes, every profile admitted, all free.
    (untiered,) = planning.tier_plan(cluster=sim.cluster).tiers
    assert (untiered.tier, untiered.gpus, untiered.total, untiered.free, untiered.withheld) == ("", 4, 5, 5, 0)
    assert [(s.kind, s.spec, s.total) for s in untiered.specs] == [
        ("full", "H100-80GB", 2),
        ("mig", "3g.40gb", 2),
        ("mig", "7g.80gb", 1),
    ]


def test_proposed_plan_is_the_seeds_arithmetic():
    mig = planning.proposed_capacity_plan("H100-80GB", 8, layout="4g.40gb,3g.40gb")
    assert mig["tiers"] == {"1": {"slots": 16, "by_spec": {"4g.40gb": 8, "3g.40gb": 8}}}
    shared = planning.proposed_capacity_plan("H100-80GB", 8, timeslice_replicas=4)
    assert shared["tiers"]["3"]["slots"] == 32
    with pytest.raises(ValueError):
        planning.proposed_capacity_plan("H100-80GB", 8, layout="4g.40gb,4g.40gb")


def requests(sim, **units):
    mig_demand(sim.cluster, **units)
    project = Project.objects.get(slug="team-a")
    now = timezone.now()
    PoolRequest.objects.create(  # a draft is no demand
        project=project, product="H100-80GB", profile_name="2g.20gb", count=3, state="draft"
    )
    PoolRequest.objects.create(  # ended before the period
        project=project,
        product="H100-80GB",
        profile_name="2g.20gb",
        count=3,
        state="released",
        start_at=now - timedelta(days=90),
        end_at=now - timedelta(days=60),
    )


def test_rebalance_proposes_layouts_from_the_periods_demand(sim):
    requests(sim, **{"1g_10gb": 6, "3g_40gb": 2})
    allocate(gpu_row("gpu-a", 0), mig_start=0)
    now = timezone.now()
    MaintenanceWindow.objects.create(
        cluster=sim.cluster, starts_at=now + timedelta(days=1), ends_at=now + timedelta(days=1, hours=2)
    )

    proposal = rebalancing.propose_rebalance(sim.cluster, "H100-80GB", days=30)

    assert proposal.requested == {"1g.10gb": 6, "3g.40gb": 2}
    assert proposal.used == {}
    assert proposal.demand == {"1g.10gb": 6, "3g.40gb": 2}
    assert proposal.before == {"3g.40gb": 2, "7g.80gb": 1}
    assert proposal.after["3g.40gb"] == 2
    assert proposal.after["1g.10gb"] >= 6
    assert "7g.80gb" not in proposal.after
    assert proposal.lost == {"7g.80gb": 1}
    assert proposal.gained["1g.10gb"] == proposal.after["1g.10gb"]
    assert proposal.plan.unmet == {}
    targets = proposal.targets_by_node()
    assert list(targets) == ["gpu-a"]
    assert list(targets["gpu-a"]) == ["1"]  # GPU 0 (allocated, already serving 3g.40gb) is not touched
    assert proposal.next_windows["gpu-a"] == (now + timedelta(days=1), now + timedelta(days=1, hours=2))
    data = proposal.to_dict()
    assert data["rows"][0]["profile"] == "1g.10gb"


def test_rebalance_counts_instances_monitoring_saw_busy(sim):
    from capacity.models import MigInstance
    from monitoring.models import Rollup1h, Series

    requests(sim, **{"3g_40gb": 1})
    now = timezone.now()
    for instance in MigInstance.objects.active().filter(gpu__node__name="gpu-a"):
        series = Series.objects.create(gpu=instance.gpu, mig_instance=instance)
        Rollup1h.objects.create(series=series, bucket=now - timedelta(hours=2), samples=120, sm_active_max=40.0)

    proposal = rebalancing.propose_rebalance(sim.cluster, "H100-80GB", days=30)
    assert proposal.used == {"3g.40gb": 2, "7g.80gb": 1}
    assert proposal.demand == {"3g.40gb": 2, "7g.80gb": 1}
    assert proposal.targets_by_node() == {}  # the layout already serves what is used


def test_rebalance_reconfigurations_run_in_the_window(sim):
    requests(sim, **{"1g_10gb": 7})
    now = timezone.now()
    MaintenanceWindow.objects.create(
        cluster=sim.cluster, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1)
    )
    proposal = rebalancing.propose_rebalance(sim.cluster, "H100-80GB", days=30)

    created, refused = rebalancing.create_rebalance_reconfigurations(
        proposal, backend="agent", drain=False, force=False
    )

    assert refused == {}
    assert [r.node.name for r in created] == ["gpu-a"]
    reconf = created[0]
    drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error
    assert MigReconfiguration.objects.get().source == "rebalance"
    assert sum(1 for p, _ in sim.layout("gpu-a", 0) + sim.layout("gpu-a", 1) if p == "1g.10gb") >= 7
