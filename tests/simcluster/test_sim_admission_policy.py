"""gpuaas's ValidatingAdmissionPolicy (deploy/admission-policy.yaml) as the simulated kube-apiserver enforces it:
the shipped manifest's CEL, evaluated through the CEL library, in every namespace, labelled or not."""

from __future__ import annotations

import pytest

from simcluster import load_scenario
from simcluster.admission import CLAIM_CONTROLLER
from simcluster.kube import ADMIN_USER, ApiError, ClusterApi
from simcluster.rbac import DEFAULT_USER as GPUAAS

UUID = 'device.attributes["gpu.nvidia.com"].uuid'
POLICY = "ValidatingAdmissionPolicy 'gpuaas-dra-claims' with binding 'gpuaas-dra-claims' denied request: "
TEMPLATE_REFUSED = (
    "ResourceClaimTemplates that request a GPU device class are written by gpuaas only; "
    "reference your pool's claim_template"
)
DELETE_REFUSED = "gpuaas's ResourceClaimTemplates are deleted by gpuaas only; release the pool instead"
CLAIM_REFUSED = (
    "ResourceClaims that request a GPU device class are made from a pod's resourceClaimTemplateName only; "
    "reference your pool's claim_template"
)


@pytest.fixture
def cluster():
    cluster = load_scenario("dra").build().cluster("dra")
    api = ClusterApi(cluster)
    api.create(
        "namespaces", None, {"metadata": {"name": "team-a", "labels": {"app.kubernetes.io/managed-by": "gpuaas"}}}
    )
    api.create("namespaces", None, {"metadata": {"name": "loose"}})  # no label: not a gpuaas namespace
    return cluster


def uuids(cluster, node: str) -> list[str]:
    return sorted(
        d["attributes"]["uuid"]["string"]
        for r in cluster.resourceslices.values()
        if r.obj["spec"]["nodeName"] == node
        for d in r.obj["spec"]["devices"]
    )


def claim_spec(device_class: str, expression: str | None = None) -> dict:
    exactly = {"deviceClassName": device_class}
    if expression:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def template(name: str, device_class: str = "gpu.nvidia.com", expression: str | None = None) -> dict:
    return {"metadata": {"name": name}, "spec": {"spec": claim_spec(device_class, expression)}}


def claim(name: str, device_class: str = "gpu.nvidia.com", expression: str | None = None) -> dict:
    return {"metadata": {"name": name}, "spec": claim_spec(device_class, expression)}


def pod(name: str, *, template_name: str | None = None, claim_name: str | None = None) -> dict:
    ref = {"name": "gpu"}
    ref |= {"resourceClaimTemplateName": template_name} if template_name else {"resourceClaimName": claim_name}
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [ref],
        },
    }


def allocated(cluster, namespace: str, pod_name: str) -> list[str]:
    by_name = {
        (d["name"], r.obj["spec"]["pool"]["name"]): d["attributes"]["uuid"]["string"]
        for r in cluster.resourceslices.values()
        for d in r.obj["spec"]["devices"]
    }
    obj = cluster.pods[(namespace, pod_name)].obj
    names = [s["resourceClaimName"] for s in obj["status"].get("resourceClaimStatuses") or ()]
    names += [c["resourceClaimName"] for c in obj["spec"]["resourceClaims"] if c.get("resourceClaimName")]
    return [
        by_name[(result["device"], result["pool"])]
        for name in names
        for result in ((cluster.resourceclaims[(namespace, name)].obj.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results", [])
    ]


def test_the_dra_scenario_installs_the_admission_policy(cluster):
    assert cluster.settings.admission_policy is True


@pytest.mark.parametrize("user", ["alice", ADMIN_USER, CLAIM_CONTROLLER])
def test_a_template_for_a_gpu_class_from_an_unlabelled_namespace_is_refused(cluster, user):
    with pytest.raises(ApiError) as refused:
        ClusterApi(cluster, user=user).create("resourceclaimtemplates", "loose", template("mine", "mig.nvidia.com"))
    assert refused.value.body() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'resourceclaimtemplates.resource.k8s.io "mine" is forbidden: {POLICY}{TEMPLATE_REFUSED}',
        "reason": "Forbidden",
        "details": {
            "name": "mine",
            "group": "resource.k8s.io",
            "kind": "resourceclaimtemplates",
            "causes": [{"message": POLICY + TEMPLATE_REFUSED}],
        },
        "code": 403,
    }
    assert ("loose", "mine") not in cluster.resourceclaimtemplates


def test_a_claim_from_an_unlabelled_namespace_cannot_obtain_a_device_another_projects_template_admits(cluster):
    """The issue's case: team-a's template admits one device; a hand-written claim in a namespace gpuaas does not
    manage names it. It is refused at admission, and team-a's pod gets the device."""
    target = uuids(cluster, "dra-h100-full-02")[0]
    ClusterApi(cluster, user=GPUAAS).create(
        "resourceclaimtemplates", "team-a", template("pool-1-gpu", expression=f"{UUID} == '{target}'")
    )
    thief = ClusterApi(cluster, user="mallory")
    with pytest.raises(ApiError) as refused:
        thief.create("resourceclaims", "loose", claim("forged", expression=f"{UUID} == '{target}'"))
    assert refused.value.code == 403 and refused.value.message.endswith(POLICY + CLAIM_REFUSED)
    assert ("loose", "forged") not in cluster.resourceclaims
    with pytest.raises(ApiError):
        thief.create("resourceclaims", "team-a", claim("forged", expression=f"{UUID} == '{target}'"))
    ClusterApi(cluster, user="bob").create("pods", "team-a", pod("trainer", template_name="pool-1-gpu"))
    assert allocated(cluster, "team-a", "trainer") == [target]


def test_dressing_a_claim_up_as_the_controllers_does_not_help(cluster):
    """The claim needs the controller's identity AND its marks: the pod-claim-name annotation and a controller
    ownerReference to a Pod. Either alone is refused."""
    dressed = claim("dressed")
    dressed["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    dressed["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}
    ]
    with pytest.raises(ApiError, match="denied request"):
        ClusterApi(cluster, user="alice").create("resourceclaims", "loose", dressed)
    with pytest.raises(ApiError, match="denied request"):
        ClusterApi(cluster, user=CLAIM_CONTROLLER).create("resourceclaims", "loose", claim("bare"))
    ClusterApi(cluster, user=CLAIM_CONTROLLER).create("resourceclaims", "loose", dressed)
    assert ("loose", "dressed") in cluster.resourceclaims


@pytest.mark.parametrize("namespace", ["team-a", "loose"])
def test_gpuaas_writes_templates_and_the_controller_makes_claims_from_them(cluster, namespace):
    """gpuaas's ServiceAccount may write a GPU template in any namespace; the resourceclaim controller's claim
    copied from it (annotation, controller ownerReference to the pod) is admitted and allocated."""
    target = uuids(cluster, "dra-h100-full-01")[0]
    ClusterApi(cluster, user=GPUAAS).create(
        "resourceclaimtemplates", namespace, template("pool-7-gpu", expression=f"{UUID} == '{target}'")
    )
    ClusterApi(cluster, user="bob").create("pods", namespace, pod("p", template_name="pool-7-gpu"))
    made = next(c.obj for k, c in cluster.resourceclaims.items() if k[0] == namespace)
    assert made["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    assert made["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    assert allocated(cluster, namespace, "p") == [target]


@pytest.mark.parametrize("user", ["alice", ADMIN_USER])
def test_gpuaas_templates_are_neither_changed_nor_deleted_by_anyone_else(cluster, user):
    api = ClusterApi(cluster, user=user)
    ClusterApi(cluster, user=GPUAAS).create("resourceclaimtemplates", "team-a", template("pool-3-gpu"))
    with pytest.raises(ApiError) as refused:
        api.patch(
            "resourceclaimtemplates",
            "team-a",
            "pool-3-gpu",
            {"metadata": {"labels": {"mine": "now"}}},
            "application/merge-patch+json",
        )
    assert refused.value.code == 403 and refused.value.message.endswith(POLICY + TEMPLATE_REFUSED)
    with pytest.raises(ApiError) as refused:
        api.delete("resourceclaimtemplates", "team-a", "pool-3-gpu")
    assert refused.value.code == 403 and refused.value.message.endswith(POLICY + DELETE_REFUSED)
    stored = cluster.resourceclaimtemplates[("team-a", "pool-3-gpu")].obj
    assert "mine" not in (stored["metadata"].get("labels") or {})
    ClusterApi(cluster, user=GPUAAS).delete("resourceclaimtemplates", "team-a", "pool-3-gpu")
    assert ("team-a", "pool-3-gpu") not in cluster.resourceclaimtemplates


def test_deleting_a_namespace_still_empties_it_of_gpuaas_templates(cluster):
    """kube-controller-manager's namespace controller deletes what the namespace holds, through admission."""
    ClusterApi(cluster, user=GPUAAS).create("resourceclaimtemplates", "team-a", template("pool-3-gpu"))
    ClusterApi(cluster).delete("namespaces", None, "team-a")
    assert not [k for k in cluster.resourceclaimtemplates if k[0] == "team-a"]


def test_templates_and_claims_for_other_device_classes_are_not_the_policys_business(cluster):
    member = ClusterApi(cluster, user="alice")
    member.create("resourceclaimtemplates", "loose", template("nic", "rdma.example.com"))
    member.create("resourceclaims", "team-a", claim("nic", "rdma.example.com"))
    member.delete("resourceclaimtemplates", "loose", "nic")
    assert ("team-a", "nic") in cluster.resourceclaims


def test_the_policy_is_enforced_only_where_installed(cluster):
    cluster.settings.admission_policy = False
    ClusterApi(cluster, user="alice").create("resourceclaimtemplates", "loose", template("t"))
    assert ("loose", "t") in cluster.resourceclaimtemplates


def test_a_malformed_template_gets_its_422_before_admission(cluster):
    with pytest.raises(ApiError) as refused:
        ClusterApi(cluster, user="alice").create(
            "resourceclaimtemplates", "loose", template("t", expression=f"{UUID} in ")
        )
    assert refused.value.code == 422
