"""Device-plugin clusters: a node whose units all belong to one project is tainted for it, its namespace
tolerates that taint by default (PodTolerationRestriction), other projects' pods cannot land there; a node
several projects share carries no taint and their pools say "shared node: binding is by count"."""

import json

import pytest
from pool_world import kube_for
from sim_pods import run_gpu_pod

from pools import provisioning, services
from pools.models import SHARED_NODE_NOTE, Allocation, GpuPool
from pools.tasks import provision_pool_task

pytestmark = pytest.mark.django_db

TAINT = "gpuaas.io/dedicated"


def _run_pod(sim, namespace: str, name: str, node: str, **spec) -> dict:
    return run_gpu_pod(sim.state, sim.state.cluster("prod"), namespace, name, node=node, **spec)


def _taint(kube, node: str):
    return [t for t in kube.get_node(node).taints if t["key"] == TAINT]


def test_a_dedicated_node_is_tainted_and_only_its_project_lands_there(sim, make_request, operator, project):
    pool = services.approve(make_request(count=2), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    (node,) = set(Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True))
    with kube_for(sim.clusters["prod"]) as kube:
        assert _taint(kube, node) == [{"key": TAINT, "value": f"project-{project.pk}", "effect": "NoSchedule"}]
        annotations = kube.get_namespace("team-a")["metadata"]["annotations"]
    own = {"key": TAINT, "operator": "Equal", "value": f"project-{project.pk}", "effect": "NoSchedule"}
    assert json.loads(annotations["scheduler.alpha.kubernetes.io/defaultTolerations"]) == [own]
    assert own in json.loads(annotations["scheduler.alpha.kubernetes.io/tolerationsWhitelist"])

    mine = _run_pod(sim, "team-a", "mine", node)
    assert mine["status"]["phase"] == "Running"
    assert own in mine["spec"]["tolerations"]
    intruder = _run_pod(sim, "intruder", "sneaky", node)
    assert intruder["status"]["phase"] == "Pending"
    assert "untolerated taint" in json.dumps(intruder["status"])


def test_a_namespace_cannot_tolerate_another_projects_taint(sim, make_request, operator, project, other_project):
    from capacity.models import Cluster

    pool = services.approve(make_request(count=2), actor=operator)
    provision_pool_task(pool.pk)
    provisioning.reconcile(other_project, Cluster.objects.get(name="prod"))  # team-b's namespace, no units
    (node,) = set(Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True))
    theirs = {"key": TAINT, "operator": "Equal", "value": f"project-{project.pk}", "effect": "NoSchedule"}
    with pytest.raises(Exception, match="conflict with its namespace whitelist"):
        _run_pod(sim, "team-b", "borrowed", node, tolerations=[theirs])


def test_a_shared_node_has_no_taint_and_its_pools_say_so(sim, make_request, operator, project, other_project):
    pool = services.approve(make_request(count=2), actor=operator)
    provision_pool_task(pool.pk)
    first = Allocation.objects.filter(pool=pool).select_related("gpu__node").first()
    node = first.gpu.node.name
    neighbour = services.approve(make_request(target=other_project, count=1), actor=operator)
    Allocation.objects.filter(pool=neighbour).update(
        gpu=first.gpu, mig_instance=None, kind="full", resource_name="nvidia.com/gpu", replica=1
    )  # a unit of team-b on the same node (the approval may have picked another node)
    provisioning.reconcile(project, pool.cluster)

    with kube_for(sim.clusters["prod"]) as kube:
        assert _taint(kube, node) == []
    assert GpuPool.objects.with_card().get(pk=pool.pk).card()["binding_note"] == SHARED_NODE_NOTE


def test_approval_prefers_nodes_and_gpus_no_other_project_uses(fleet, make_request, operator, other_project):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"], ["3g.40gb", "3g.40gb"]])
    fleet.mig_node("n2", [["3g.40gb", "3g.40gb"]])
    theirs = services.approve(make_request(target=other_project, count=1), actor=operator)
    assert [a.gpu.node.name for a in theirs.allocations.all()] == ["n1"]

    ours = services.approve(make_request(count=2), actor=operator)  # n2 holds two: a whole node

    assert [(a.gpu.node.name, a.gpu.index) for a in ours.allocations.select_related("gpu__node")] == [
        ("n2", 0),
        ("n2", 0),
    ]
    more = services.approve(make_request(count=2), actor=operator)  # n1's GPU 1 is whole
    assert [(a.gpu.node.name, a.gpu.index) for a in more.allocations.select_related("gpu__node")] == [
        ("n1", 1),
        ("n1", 1),
    ]
