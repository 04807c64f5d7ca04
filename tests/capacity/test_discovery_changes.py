"""Changes in the cluster show up after the next discovery, and only what changed is written."""

import pytest

from capacity.adapters.kubernetes import KubernetesClient
from capacity.models import MigInstance, NodeCapacity, SpecAndCount
from capacity.services.discovery import discover_cluster

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]

NODE = "prod-h100-bal-02"  # no GPU pods run there: the MIG manager may reconfigure it


@pytest.fixture
def sim(simcluster):
    sim = simcluster("demo")
    sim.register("prod")
    discover(sim)
    return sim


def discover(sim, inventory="inline"):
    outcome = discover_cluster(sim.clusters["prod"].pk, inventory=inventory)
    assert outcome.run.status == "succeeded", outcome.run.error
    return outcome


def kube(sim) -> KubernetesClient:
    return KubernetesClient.from_kubeconfig(str(sim.kubeconfigs["prod"]))


def specs(node_name):
    return dict(SpecAndCount.objects.filter(node__name=node_name).values_list("resource_name", "count"))


def test_a_mig_config_label_change_changes_specs_and_instances(sim):
    assert specs(NODE) == {"nvidia.com/mig-1g.10gb": 16, "nvidia.com/mig-2g.20gb": 8, "nvidia.com/mig-3g.40gb": 8}
    old = set(MigInstance.objects.active().filter(gpu__node__name=NODE).values_list("uuid", flat=True))
    with kube(sim) as k:
        k.patch_node_labels(NODE, {"nvidia.com/mig.config": "all-1g.10gb"})
    pending = discover(sim)
    node = NodeCapacity.objects.get(name=NODE)
    assert (pending.sync.nodes_updated, node.mig_config, node.mig_config_state) == (1, "all-1g.10gb", "pending")
    sim.state.run_mig_manager()

    done = discover(sim)
    node.refresh_from_db()
    assert (done.sync.nodes_updated, node.mig_config_state) == (1, "success")
    assert specs(NODE) == {"nvidia.com/mig-1g.10gb": 56}
    assert done.sync.specs_deleted == 2
    active = MigInstance.objects.active().filter(gpu__node__name=NODE)
    assert active.count() == 56
    assert set(active.values_list("profile__name", flat=True)) == {"1g.10gb"}
    assert sorted(set(active.values_list("placement_start", flat=True))) == [0, 1, 2, 3, 4, 5, 6]
    gone = MigInstance.objects.filter(uuid__in=old)
    assert set(gone.values_list("state", flat=True)) == {"gone"}
    assert all(g.gone_at is not None for g in gone)


def test_tier_and_group_labels_cordon_and_readiness(sim):
    with kube(sim) as k:
        k.patch_node_labels(NODE, {"gpuaas.io/tier": "2", "gpuaas.io/node-group": "staging"})
        k.cordon("prod-h100-full-02")
    sim.faults.node_ready("prod", "prod-h100-4g3g-02", False)
    outcome = discover(sim, inventory="none")
    assert outcome.sync.nodes_updated == 3
    rows = {n.name: n for n in NodeCapacity.objects.filter(cluster=sim.clusters["prod"])}
    assert (rows[NODE].tier, rows[NODE].node_group) == ("2", "staging")
    assert rows["prod-h100-full-02"].cordoned is True
    assert rows["prod-h100-4g3g-02"].ready is False
    assert NodeCapacity.objects.for_cluster(sim.clusters["prod"]).schedulable().count() == 4
    cluster = sim.clusters["prod"]
    cluster.refresh_from_db()
    assert cluster.status == "degraded"
    assert outcome.run.nodes_seen == 6


def test_a_vanished_node_comes_back_when_listed_again(sim):
    sim.faults.node_vanish("prod", NODE)
    discover(sim, inventory="none")
    assert NodeCapacity.objects.get(name=NODE).is_gone
    assert NodeCapacity.objects.for_cluster(sim.clusters["prod"]).present().count() == 5
    specs_of_prod = SpecAndCount.objects.filter(node__cluster=sim.clusters["prod"])
    assert (specs_of_prod.count(), specs_of_prod.present().count()) == (16, 13)  # kept, but not offered
    sim.faults.reset()
    back = discover(sim, inventory="none")
    node = NodeCapacity.objects.get(name=NODE)
    assert (back.sync.nodes_updated, back.sync.inventory_nodes, node.gone_at) == (1, [NODE], None)
    assert NodeCapacity.objects.filter(name=NODE).count() == 1
