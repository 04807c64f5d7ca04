"""deploy/clusterrole.yaml is exactly what the Kubernetes adapter needs: no request outside it, no rule unused.

Two clusters through the simulator with the role enforced (simcluster/rbac.py: a request the role does not
allow gets 403 Forbidden, as kube-apiserver answers) and every request recorded. Under the device plugin:
discovery, provisioning, drift repair by the reconcile, release, a MIG reconfiguration through the GPU
Operator and one through the node agent (mig-parted ConfigMap, nvidia.com/mig.config label, cordon,
eviction, device plugin restart), and time-slicing config. Under DRA (the "dra" scenario, admission policy
on as deploy/ installs it): discovery of ResourceSlices and ResourceClaims, a pool's ResourceClaimTemplate
created, repaired after deletion, removed on release. The recorded (group, resource, verb) set must equal
what the role grants; the failure message says which rule to add or remove.
The whole suite's cluster scenarios can be recorded too: GPUAAS_RECORD_K8S_REQUESTS (tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.test import override_settings
from reconfig_sim import drive, node_row, start_sim

from capacity.adapters.kubernetes.transport import USER_AGENT
from capacity.models import DiscoveryRun, TimeSlicingPolicy
from capacity.services.clusters import register_cluster
from capacity.services.discovery import discover_cluster
from capacity.services.mig_configs import apply_time_slicing
from capacity.services.vgpu import set_vgpu_config
from operations import reconfiguration as rc
from pools import lending, services
from pools.models import Allocation, GpuPool
from pools.provisioning import deprovision_pool, provision_pool, reconcile, reconcile_provisioned
from simcluster import (
    SimServer,
    kubevirt_cr,
    load_scenario,
)
from simcluster.gpuoperator import refresh_devices
from simcluster.kube import ClusterApi
from simcluster.rbac import Access, Role, access_of, advice, compare
from tenancy.models import Project

pytestmark = pytest.mark.django_db

ROLE_FILE = Path(__file__).resolve().parents[2] / "deploy" / "clusterrole.yaml"
NODES = [
    ("gpu-mig", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"], 1: ["7g.80gb"]}, ""),
    ("gpu-full", "H100-80GB", 2, None, "dev"),
]


@pytest.fixture
def sim(tmp_path, settings):
    settings.KUBERNETES_RETRIES = 0  # a 403 is never retried anyway; keep any other failure immediate
    sim = start_sim(tmp_path, NODES)
    yield sim
    sim.server.stop()


def enforce(sim, role: Role, requests: list[Access] | None = None) -> list[Access]:
    """Turn the role on in the simulator and record what gpuaas's adapter asks for from now on."""
    requests = [] if requests is None else requests
    sim.state.api.role = role
    sim.state.api.on_request = lambda access, user_agent: user_agent == USER_AGENT and requests.append(access)
    return requests


def used(requests: list[Access]) -> set[tuple[str, str, str]]:
    return {access.key for access in requests}


def make_request(project, actor, **values):
    spec = services.resolve_spec(isolation="full", product="H100-80GB")
    return services.create_request(
        project,
        actor=actor,
        submit=True,
        isolation=spec.isolation,
        tier=spec.tier,
        spec_kind=spec.spec_kind,
        product=spec.product,
        profile_name=spec.profile_name,
        **values,
    )


def run_every_flow(sim, project, operator) -> None:
    """Everything gpuaas does to a cluster, each step checked so a 403 cannot pass unnoticed."""
    sim.discover()  # nodes, pods of every namespace

    pool = services.approve(make_request(project, operator, count=1), actor=operator)
    assert provision_pool(GpuPool.objects.get(pk=pool.pk)) == "active"  # namespace, quota, node labels
    node = Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True).get()
    api = ClusterApi(sim.sim_cluster)  # drift, made behind gpuaas's back (not through its adapter)
    with sim.state.lock:
        api.delete("resourcequotas", project.namespace, f"gpuaas-{pool.pk}", 0)
        api.patch(
            "nodes",
            None,
            node,
            {"metadata": {"labels": {f"gpuaas.io/pool-{pool.pk}": None}}},
            "application/merge-patch+json",
        )
        api.patch(
            "namespaces",
            None,
            project.namespace,
            {"metadata": {"annotations": {"scheduler.alpha.kubernetes.io/node-selector": "x=y"}}},
            "application/merge-patch+json",
        )
    assert reconcile_provisioned()["repaired"] == 3
    second = services.approve(make_request(project, operator, count=1), actor=operator)
    assert provision_pool(GpuPool.objects.get(pk=second.pk)) == "active"  # the quota exists: replaced
    # Borrowing: the unit lent (PriorityClass gpuaas-borrowed, borrower quota), then reclaimed (pods listed, evicted).
    borrower = Project.objects.create(name="Borrower", slug="borrower", namespace="borrower")
    GpuPool.objects.filter(pk=second.pk).update(lending_enabled=True)  # lending is opt-in
    lending.lend(Allocation.objects.active().get(pool=second), borrower)
    reconcile(borrower, sim.cluster)
    assert lending.reclaim_pool(second) == 1
    with override_settings(LENDING_RECLAIM_GRACE_S=0):
        assert lending.reconcile_loans(sim.cluster)["ended"] == 1
    services.release(pool.request, actor=operator)
    assert deprovision_pool(GpuPool.objects.get(pk=pool.pk)) is True  # quota deleted

    sim.add_gpu_pod("gpu-mig", "trainer", "nvidia.com/mig-3g.40gb", namespace="team-b")
    # Through the GPU Operator: mig-parted ConfigMap, nvidia.com/mig.config, cordon, drain (eviction), uncordon.
    source, target = rc.target_from(node_row("gpu-mig"), named="all-1g.10gb")
    reconf = rc.create(node_row("gpu-mig"), target, source=source, force=True, drain=True, actor=operator)
    outcomes = drive(sim, reconf)
    assert reconf.state == "succeeded", (reconf.step, reconf.error, outcomes)
    # Through the node agent (NVML), which then restarts the device plugin's pod on the node.
    target = {"1": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]}
    reconf = rc.create(node_row("gpu-mig"), target, backend="agent", force=True, actor=operator)
    drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error

    TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=4)
    assert apply_time_slicing(sim.cluster)["labelled"] == 1

    # vGPU: a vm-vgpu node's type set (device manager ConfigMap, the KubeVirt CR's permitted devices, the label).
    with sim.state.lock:
        kubevirt_cr.install(ClusterApi(sim.sim_cluster))
        vm_node = sim.sim_cluster.nodes["gpu-full"]
        vm_node.labels.update({"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "H100XM-40C"})
        refresh_devices(sim.sim_cluster, vm_node)
    sim.discover()
    assert set_vgpu_config(node_row("gpu-full"), "H100XM-20C").changed


def run_dra_flow(tmp_path, role: Role, requests: list[Access], project, operator) -> None:
    """A DRA cluster: discovery (slices, claims), a pool's claim template created, repaired, removed."""
    tmp_path.mkdir(exist_ok=True)
    state = load_scenario("dra").build()
    assert state.cluster("dra").settings.admission_policy  # gpuaas's writes pass deploy/admission-policy.yaml
    with SimServer(state) as server:
        enforce(server, role, requests)
        cluster, _ = register_cluster("dra", server.write_kubeconfigs(tmp_path)["dra"])
        run = discover_cluster(cluster.pk, inventory="inline").run
        assert run.status == "succeeded", run.error
        pool = services.approve(make_request(project, operator, count=1, cluster=cluster), actor=operator)
        assert provision_pool(GpuPool.objects.get(pk=pool.pk)) == "active"
        name = GpuPool.objects.get(pk=pool.pk).claim_template
        sim = state.cluster("dra")
        assert (project.namespace, name) in sim.resourceclaimtemplates
        with state.lock:  # drift: the template deleted behind gpuaas's back (the admission policy refuses that,
            sim.settings.admission_policy = False  # so it is taken off for the deletion, as on a cluster without it)
            ClusterApi(sim).delete("resourceclaimtemplates", project.namespace, name)
            sim.settings.admission_policy = True
        assert reconcile_provisioned()["errors"] == 0
        assert (project.namespace, name) in sim.resourceclaimtemplates
        services.release(pool.request, actor=operator)
        assert deprovision_pool(GpuPool.objects.get(pk=pool.pk)) is True
        assert (project.namespace, name) not in sim.resourceclaimtemplates


def test_the_role_is_exactly_what_gpuaas_uses(sim, project, operator, tmp_path):
    role = Role.from_manifest(ROLE_FILE)
    requests = enforce(sim, role)

    run_every_flow(sim, project, operator)
    run_dra_flow(tmp_path / "dra", role, requests, project, operator)

    missing, unused = compare(role, used(requests))
    assert not (missing or unused), "\n" + advice(missing, unused, "deploy/clusterrole.yaml")


def test_a_request_outside_the_role_is_refused_and_named(sim):
    rules = yaml.safe_load(ROLE_FILE.read_text())["rules"]
    narrowed = Role([rule for rule in rules if rule["resources"] != ["pods"]], name="without-pods")
    requests = enforce(sim, narrowed)

    outcome = discover_cluster(sim.cluster.pk, inventory="inline")

    run = DiscoveryRun.objects.get(pk=outcome.run.pk)
    assert run.status == "failed"
    assert 'cannot list resource "pods" in API group "" at the cluster scope' in run.error
    assert "403" in run.error
    assert ("", "pods", "list") in used(requests)


def test_forbidden_answer_has_kube_apiservers_shape():
    role = Role([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}])
    evict = access_of("POST", "/api/v1/namespaces/team-a/pods/p1/eviction", {})
    assert evict == Access("create", "", "pods", "eviction", True, "team-a", "p1")
    assert not role.allows(evict)
    assert role.forbidden(evict).body() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "p1" is forbidden: User "system:serviceaccount:gpuaas:gpuaas-controller" cannot create'
        ' resource "pods/eviction" in API group "" in the namespace "team-a"',
        "reason": "Forbidden",
        "details": {"kind": "pods", "name": "p1"},
        "code": 403,
    }
    assert role.allows(access_of("GET", "/api/v1/nodes/gpu-a", {}))
    assert access_of("GET", "/api/v1/nodes", {"watch": ["true"]}).verb == "watch"
    assert access_of("DELETE", "/api/v1/namespaces/x/configmaps", {}).verb == "deletecollection"
    assert access_of("PATCH", "/api/v1/namespaces/team-a", {}) == Access("patch", "", "namespaces", name="team-a")
    slices = access_of("GET", "/apis/resource.k8s.io/v1/resourceslices", {})
    assert slices.key == ("resource.k8s.io", "resourceslices", "list")
    assert access_of("GET", "/api/v1", {}) is None  # discovery: a non-resource URL, never checked


def test_advice_names_the_rule_to_add_or_remove():
    role = Role([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}])
    missing, unused = compare(role, {("", "nodes", "get"), ("resource.k8s.io", "resourceslices", "list")})
    assert missing == {("resource.k8s.io", "resourceslices", "list")}
    assert unused == {("", "nodes", "list")}
    assert advice(missing, unused, "deploy/clusterrole.yaml").splitlines() == [
        'deploy/clusterrole.yaml: add verb "list" on resource "resourceslices" in apiGroups ["resource.k8s.io"]'
        " (used, not granted)",
        'deploy/clusterrole.yaml: remove verb "list" on resource "nodes" in apiGroups [""] (granted, never used)',
    ]
