"""Exact binding with DRA against the simulator's DRA cluster (scenario "dra", docs/dra.md): discovery reads the
driver's ResourceSlices, provisioning writes one claim template per pool and unit kind admitting only the pool's
UUIDs, pods get only those devices, the workload tracker reads the claims, and templates follow releases."""

from __future__ import annotations

import pytest
from pool_world import kube_for

from capacity.models import MigInstance, NodeCapacity, WorkloadProfile
from capacity.services.discovery import discover_cluster
from pools import services
from pools.models import Allocation, GpuPool, PoolRequestTransition
from pools.provisioning import reconcile_provisioned
from pools.tasks import deprovision_pool_task, provision_pool_task, reconcile_project_task

pytestmark = pytest.mark.django_db
# The namespace's node selector (PodNodeSelector) still narrows the nodes; on the pool's node the claim fails.
CANNOT = "0/4 nodes are available: 3 node(s) didn't match Pod's node affinity/selector, 1 cannot allocate all claims."


@pytest.fixture
def dra_sim(db, tmp_path, settings):
    """The "dra" scenario (2 MIG nodes with 3g.40gb instances, 2 whole-GPU nodes) served, registered, discovered."""
    from capacity.services.clusters import register_cluster
    from simcluster import SimServer, load_scenario

    settings.KUBERNETES_RETRIES = 0
    state = load_scenario("dra").build()
    with SimServer(state) as server:
        path = server.write_kubeconfigs(tmp_path)["dra"]
        cluster, _ = register_cluster("dra", path)
        run = discover_cluster(cluster.pk, inventory="inline").run
        assert run.status == "succeeded", run.error
        server.cluster = cluster
        server.sim = state.cluster("dra")
        yield server


def run_pod(sim, namespace: str, name: str, template: str) -> dict:
    """Create a pod that references a claim template (as a user would) and return it as the simulator holds it."""
    from simcluster.kube import ClusterApi

    body = {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }
    with sim.state.lock:
        ClusterApi(sim.sim).create("pods", namespace, body)
        return sim.sim.pods[(namespace, name)].obj


def pod_devices(sim, namespace: str, name: str) -> list[str]:
    """UUIDs of the devices the pod's claims were allocated (empty while Pending)."""
    cluster = sim.sim
    pod = cluster.pods[(namespace, name)].obj
    uuids = {
        (r.obj["spec"]["pool"]["name"], d["name"]): d["attributes"]["uuid"]["string"]
        for r in cluster.resourceslices.values()
        for d in r.obj["spec"]["devices"]
    }
    found = []
    for status in pod["status"].get("resourceClaimStatuses") or ():
        claim = cluster.resourceclaims[(namespace, status["resourceClaimName"])].obj
        for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            found.append(uuids[(result["pool"], result["device"])])
    return found


def pool_uuids(pool) -> list[str]:
    return sorted(Allocation.objects.active().filter(pool=pool).values_list("mig_instance__uuid", flat=True))


def template_uuids(kube, namespace: str, name: str) -> list[str]:
    templates = {t["metadata"]["name"]: t for t in kube.list_resource_claim_templates(namespace)}
    expression = templates[name]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"][
        "expression"
    ]
    subject, listed = expression.split(" in [")
    assert subject == 'device.attributes["gpu.nvidia.com"].uuid'
    return sorted(part.strip(' "') for part in listed.rstrip("]").split(","))


@pytest.fixture
def two_pools(dra_sim, make_request, operator, other_project, charlie):
    """Team A and team B each hold 2 x 3g.40gb, provisioned."""
    a = services.approve(make_request(count=2), actor=operator)
    b = services.approve(make_request(count=2, target=other_project, actor=charlie), actor=operator)
    for pool in (a, b):
        assert provision_pool_task(pool.pk) == "active"
    return a, b


def test_discovery_reads_the_drivers_slices_and_records_dra_binding(dra_sim):
    cluster = dra_sim.cluster
    cluster.refresh_from_db()
    assert cluster.binding == "dra"
    node = NodeCapacity.objects.get(cluster=cluster, name="dra-h100-mig-01")
    sim_node = dra_sim.sim.nodes["dra-h100-mig-01"]
    assert node.dra_devices == {
        f"gpu-{gpu.index}-mig-9-{gi.start}-4": ci.uuid for gpu in sim_node.gpus for gi, ci in gpu.mig_devices()
    }
    # The same UUIDs NVML gave the MIG instances: the slices match the inventory row for row.
    assert sorted(node.dra_devices.values()) == sorted(
        MigInstance.objects.filter(gpu__node=node).values_list("uuid", flat=True)
    )
    full = NodeCapacity.objects.get(cluster=cluster, name="dra-h100-full-01")
    assert sorted(full.dra_devices) == ["gpu-0", "gpu-1"]
    assert sorted(full.dra_devices.values()) == sorted(full.gpus.values_list("uuid", flat=True))


def test_each_pool_gets_a_template_admitting_exactly_its_units(two_pools, dra_sim):
    a, b = two_pools
    with kube_for(dra_sim.cluster) as kube:
        assert template_uuids(kube, "team-a", f"gpuaas-{a.pk}-mig-3g.40gb") == pool_uuids(a)
        assert template_uuids(kube, "team-b", f"gpuaas-{b.pk}-mig-3g.40gb") == pool_uuids(b)
        (template,) = kube.list_resource_claim_templates("team-a")
        assert template["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuaas", "gpuaas.io/pool": str(a.pk)}
        assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "mig.nvidia.com"


def test_pods_get_only_their_pools_devices_and_wait_when_those_are_taken(two_pools, dra_sim):
    """Under DRA a pod of project A can never obtain B's device, and a pod within its claim always can."""
    a, b = two_pools
    for team, pool in (("team-a", a), ("team-b", b)):
        template = f"gpuaas-{pool.pk}-mig-3g.40gb"
        for i in range(3):
            run_pod(dra_sim, team, f"job-{i}", template)
        got = pod_devices(dra_sim, team, "job-0") + pod_devices(dra_sim, team, "job-1")
        assert sorted(got) == pool_uuids(pool)
        waiting = dra_sim.sim.pods[(team, "job-2")].obj["status"]
        assert (waiting["phase"], waiting["conditions"][0]["message"]) == ("Pending", CANNOT)
    # Team A's pool still has free MIG instances on the cluster around it; they are not A's, so A waits.
    free = MigInstance.objects.exclude(uuid__in=pool_uuids(a) + pool_uuids(b)).count()
    assert free > 0


def test_a_member_cannot_forge_a_claim_or_template_for_another_projects_unit(two_pools, dra_sim):
    """Provisioned namespaces carry gpuaas's label, so the admission policy (deploy/admission-policy.yaml, on in
    the "dra" scenario) refuses a hand-written claim or template; gpuaas's own templates went through it."""
    from simcluster.kube import ApiError, ClusterApi

    a, b = two_pools
    target = pool_uuids(b)[0]
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "mig.nvidia.com",
                        "selectors": [
                            {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{target}"'}}
                        ],
                    },
                }
            ]
        }
    }
    member = ClusterApi(dra_sim.sim, user="alice")
    with dra_sim.sim.state.lock:
        for plural, body in (
            ("resourceclaims", {"metadata": {"name": "mine"}, "spec": spec}),
            ("resourceclaimtemplates", {"metadata": {"name": "mine"}, "spec": {"spec": spec}}),
        ):
            with pytest.raises(ApiError) as refused:
                member.create(plural, "team-a", body)
            assert refused.value.code == 403
            assert "ValidatingAdmissionPolicy 'gpuaas-dra-claims' with binding 'gpuaas-dra-claims' denied" in (
                refused.value.message
            )
        assert not [k for k in dra_sim.sim.resourceclaims if k[0] == "team-a"]
    run_pod(dra_sim, "team-a", "own", f"gpuaas-{a.pk}-mig-3g.40gb")
    assert pod_devices(dra_sim, "team-a", "own")[0] in pool_uuids(a)


def test_gpuaas_under_another_service_account_than_the_policy_names_fails_provisioning_and_says_why(
    dra_sim, make_request, operator
):
    """Installed in another namespace without editing the policy: the template write is refused and the pool says so."""
    from simcluster.rbac import Role

    dra_sim.state.api.role = Role(
        [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        user="system:serviceaccount:platform:gpuaas-controller",
    )
    pool = services.approve(make_request(count=1), actor=operator)
    assert provision_pool_task(pool.pk) == "failed"
    pool.refresh_from_db()
    assert "403" in pool.state_reason
    assert "ValidatingAdmissionPolicy 'gpuaas-dra-claims' with binding 'gpuaas-dra-claims' denied request" in (
        pool.state_reason
    )
    assert not [k for k in dra_sim.sim.resourceclaimtemplates if k[0] == "team-a"]


def test_workload_tracker_takes_the_device_from_the_claim(two_pools, dra_sim, project):
    a, _ = two_pools
    run_pod(dra_sim, "team-a", "infer", f"gpuaas-{a.pk}-mig-3g.40gb")
    (uuid,) = pod_devices(dra_sim, "team-a", "infer")
    assert discover_cluster(dra_sim.cluster.pk, inventory="none").run.status == "succeeded"
    row = WorkloadProfile.objects.get(pod_name="infer")
    assert (row.namespace, row.project_id, row.resource_name, row.count) == (
        "team-a",
        project.pk,
        "nvidia.com/mig-3g.40gb",
        1,
    )
    assert row.mig_instance.uuid == uuid and row.device_ids == [uuid]
    assert row.node.name == dra_sim.sim.pods[("team-a", "infer")].obj["spec"]["nodeName"]
    card = GpuPool.objects.with_card().get(pk=a.pk)
    assert (card.units_in_use, card.units_total) == (1, 2)


def test_release_of_a_unit_then_of_the_pool_keeps_the_template_in_step(
    two_pools, dra_sim, django_capture_on_commit_callbacks
):
    a, _ = two_pools
    name = f"gpuaas-{a.pk}-mig-3g.40gb"
    first = Allocation.objects.active().filter(pool=a).order_by("pk").first()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.release_allocation(first.pk) is True
    assert "pools.tasks.reconcile_project_task" in [cb.func.__self__.name for cb in callbacks]
    assert reconcile_project_task(a.project_id, a.cluster_id) is True
    with kube_for(dra_sim.cluster) as kube:
        assert template_uuids(kube, "team-a", name) == pool_uuids(a)
        assert first.mig_instance.uuid not in template_uuids(kube, "team-a", name)
    # A pod made from the new template cannot get the released unit.
    run_pod(dra_sim, "team-a", "after", name)
    assert pod_devices(dra_sim, "team-a", "after") == pool_uuids(a)

    services.release(a.request, actor=None, reason="done")
    assert deprovision_pool_task(a.pk) is True
    with kube_for(dra_sim.cluster) as kube:
        assert kube.list_resource_claim_templates("team-a") == []
        assert len(kube.list_resource_claim_templates("team-b")) == 1


def test_drift_repair_recreates_a_deleted_template_and_records_it(two_pools, dra_sim):
    a, b = two_pools
    name = f"gpuaas-{a.pk}-mig-3g.40gb"
    with kube_for(dra_sim.cluster) as kube:
        kube.delete_resource_claim_template("team-a", name)
        kube.create_resource_claim_template(
            "team-a",
            f"gpuaas-{a.pk}-gpu",
            {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}},
            labels={"app.kubernetes.io/managed-by": "gpuaas", "gpuaas.io/pool": str(a.pk)},
        )
    result = reconcile_provisioned()
    assert result["errors"] == 0 and result["repaired"] == 2
    with kube_for(dra_sim.cluster) as kube:
        assert [t["metadata"]["name"] for t in kube.list_resource_claim_templates("team-a")] == [name]
        assert template_uuids(kube, "team-a", name) == pool_uuids(a)
    reason = PoolRequestTransition.objects.filter(request=a.request, reason__startswith="reconcile").get().reason
    assert f"claim template team-a/{name} recreated" in reason
    assert f"claim template team-a/gpuaas-{a.pk}-gpu removed" in reason
    assert reconcile_provisioned()["repaired"] == 0  # nothing drifted any more: nothing written


def test_pool_api_shows_dra_binding_and_the_claim_template(two_pools, api, alice):
    a, _ = two_pools
    body = api(alice).get(f"/api/v1/pools/{a.pk}/").json()
    assert (body["binding"], body["claim_template"]) == ("dra", f"gpuaas-{a.pk}-mig-3g.40gb")


def test_device_plugin_pools_say_so(sim, make_request, operator, api, alice):
    pool = services.approve(make_request(count=1), actor=operator)
    body = api(alice).get(f"/api/v1/pools/{pool.pk}/").json()
    assert (body["binding"], body["claim_template"]) == ("device-plugin", None)
