"""Tier placement owned by gpuaas: assignments write gpuaas.io/tier, reconcile puts it back, pools carry their
tier's node affinity, and the per-tier MIG profile policy holds in approval."""

import json

import pytest
from pool_world import kube_for

from capacity.adapters.kubernetes import NotFound
from capacity.models import NodeCapacity, TierAssignment, TierProfilePolicy
from capacity.services import tiers as tier_services
from capacity.services.discovery import discover_cluster
from capacity.tasks import reconcile_all_tier_labels_task, reconcile_tier_labels_task
from pools import services
from pools.exceptions import InsufficientCapacity
from pools.tasks import deprovision_pool_task, provision_pool_task

pytestmark = pytest.mark.django_db

URL = "/api/v1/capacity/tier-assignments/"


def tier_label(cluster, name):
    with kube_for(cluster) as kube:
        return kube.get_node(name).labels.get("gpuaas.io/tier")


def test_assignment_writes_the_label_after_commit_and_reconcile_restores_it(
    sim, operator, django_capture_on_commit_callbacks
):
    prod = sim.clusters["prod"]
    node = NodeCapacity.objects.get(cluster=prod, name="prod-h100-bal-02")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        tier_services.assign_tier(node, "2", actor=operator)
    assert [(cb.func.__self__.name, cb.args) for cb in callbacks] == [
        ("capacity.tasks.reconcile_tier_labels_task", (prod.pk,))
    ]
    assert NodeCapacity.objects.get(pk=node.pk).tier == "2"  # approval sees it at once
    assert reconcile_tier_labels_task(prod.pk) == {"in_step": 0, "patched": ["prod-h100-bal-02"], "missing": []}
    assert tier_label(prod, "prod-h100-bal-02") == "2"
    assert TierAssignment.objects.get(node=node).labelled_at is not None

    with kube_for(prod) as kube:  # someone edits the label by hand
        kube.patch_node_labels("prod-h100-bal-02", {"gpuaas.io/tier": "3"})
    assert discover_cluster(prod.pk, inventory="inline").run.status == "succeeded"
    assert NodeCapacity.objects.get(pk=node.pk).tier == "2"  # discovery keeps what gpuaas owns
    assert reconcile_tier_labels_task(prod.pk)["patched"] == ["prod-h100-bal-02"]
    assert tier_label(prod, "prod-h100-bal-02") == "2"
    assert reconcile_tier_labels_task(prod.pk) == {"in_step": 1, "patched": [], "missing": []}
    assert reconcile_all_tier_labels_task() == 1


def test_untiering_removes_the_label_and_unassigning_leaves_it(sim, operator):
    prod = sim.clusters["prod"]
    node = NodeCapacity.objects.get(cluster=prod, name="prod-h100-bal-02")
    tier_services.assign_tier(node, "1", actor=operator)
    reconcile_tier_labels_task(prod.pk)
    tier_services.assign_tier(node, "", actor=operator)
    reconcile_tier_labels_task(prod.pk)
    assert tier_label(prod, "prod-h100-bal-02") is None
    tier_services.assign_tier(node, "full", actor=operator)
    reconcile_tier_labels_task(prod.pk)
    assert tier_services.unassign_tier(node) is True
    assert reconcile_tier_labels_task(prod.pk) == {"in_step": 0, "patched": [], "missing": []}
    assert tier_label(prod, "prod-h100-bal-02") == "full"


def test_assignment_api_is_for_operators(api, operator, bob, fleet, django_capture_on_commit_callbacks):
    node = fleet.full_node("n1", gpus=1, tier="")
    assert api(bob).post(URL, {"node": node.pk, "tier": "1"}, format="json").status_code == 403
    assert not TierAssignment.objects.exists()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api(operator).post(URL, {"node": node.pk, "tier": "1"}, format="json")
    assert response.status_code == 201, response.data
    assert (response.data["node_name"], response.data["tier"], response.data["labelled_at"]) == ("n1", "1", None)
    assert len(callbacks) == 1
    bad = api(operator).post(URL, {"node": node.pk, "tier": "7"}, format="json")
    assert bad.status_code == 400 and set(bad.data) == {"tier"}


def test_policy_api_refuses_an_upside_down_range(api, operator):
    row = TierProfilePolicy.objects.get(tier="1")
    body = {"min_compute_slices": 4, "max_compute_slices": 2}
    response = api(operator).patch(f"/api/v1/capacity/tier-policies/{row.pk}/", body, format="json")
    assert response.status_code == 400 and set(response.data) == {"max_compute_slices"}
    assert TierProfilePolicy.objects.get(tier="1").policy.label() == "3g and larger"  # unchanged


@pytest.mark.parametrize("tier", ["1", ""])
def test_a_second_policy_for_a_tier_is_a_400_that_says_to_edit_the_row(api, operator, tier):
    body = {"tier": tier, "min_compute_slices": 1, "max_compute_slices": 8}
    response = api(operator).post("/api/v1/capacity/tier-policies/", body, format="json")
    assert response.status_code == 400 and set(response.data) == {"tier"}
    assert "PATCH" in str(response.data["tier"][0])
    assert TierProfilePolicy.objects.filter(tier=tier).count() == 1


def test_tier_1_policy_keeps_small_profiles_off_tier_1_nodes(fleet, make_request, operator):
    fleet.mig_node("t1", [["1g.10gb"] * 7], tier="1")
    request = make_request(profile_name="1g.10gb", count=1, tier="1")
    with pytest.raises(InsufficientCapacity):
        services.approve(request, actor=operator)
    TierProfilePolicy.objects.filter(tier="1").update(min_compute_slices=1, max_compute_slices=8)
    pool = services.approve(make_request(profile_name="1g.10gb", count=1, tier="1"), actor=operator)
    assert pool.allocations.count() == 1


def test_operator_policy_limits_a_tier_to_small_slices(fleet, make_request, operator):
    fleet.mig_node("staging", [["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"]], tier="2")
    TierProfilePolicy.objects.filter(tier="2").update(min_compute_slices=1, max_compute_slices=2)
    assert services.approve(make_request(profile_name="1g.10gb", count=3, tier="2"), actor=operator)
    with pytest.raises(InsufficientCapacity):
        services.approve(make_request(profile_name="3g.40gb", count=1, tier="2"), actor=operator)


def test_provisioning_publishes_the_pools_tier_affinity(sim, make_request, operator):
    prod = sim.clusters["prod"]
    pool = services.approve(make_request(count=2), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    with kube_for(prod) as kube:
        data = kube.get_config_map("team-a", f"gpuaas-pool-{pool.pk}")["data"]
    assert data["tier"] == pool.tier == "1"
    assert json.loads(data["nodeSelector.json"]) == {f"gpuaas.io/pool-{pool.pk}": "true", "gpuaas.io/tier": "1"}
    terms = json.loads(data["affinity.json"])["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][1] == {
        "key": "gpuaas.io/tier",
        "operator": "In",
        "values": ["1"],
    }
    services.release(pool.request, actor=operator, reason="done")
    assert deprovision_pool_task(pool.pk) is True
    with kube_for(prod) as kube:
        with pytest.raises(NotFound):
            kube.get_config_map("team-a", f"gpuaas-pool-{pool.pk}")


def test_assignment_patch_changes_the_tier(api, operator, fleet):
    node = fleet.full_node("n1", gpus=1, tier="")
    created = api(operator).post(URL, {"node": node.pk, "tier": "1"}, format="json").data
    assert api(operator).patch(f"{URL}{created['id']}/", {}, format="json").status_code == 200
    response = api(operator).patch(f"{URL}{created['id']}/", {"tier": "2"}, format="json")
    assert (response.status_code, response.data["tier"]) == (200, "2")
    assert NodeCapacity.objects.get(pk=node.pk).tier == "2"
