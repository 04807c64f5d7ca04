"""deploy/admission-policy.yaml is what the simulator enforces (simcluster/admission.py reads it and evaluates its
CEL as written), so these tests run the shipped rules themselves: every namespace, GPU classes only, gpuaas's
ServiceAccount for templates, the resourceclaim controller's copies for claims, gpuaas's templates kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pools.provisioning import DRA_CLASS
from simcluster import admission
from simcluster.rbac import DEFAULT_USER as GPUAAS

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "admission-policy.yaml"
GROUP, VERSION = "resource.k8s.io", "v1"
KINDS = {"resourceclaimtemplates": "ResourceClaimTemplate", "resourceclaims": "ResourceClaim"}
LOOSE = {"metadata": {"name": "loose"}}  # a namespace without gpuaas's label


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


def spec(device_class: str = "gpu.nvidia.com", *, first_available: bool = False) -> dict:
    if first_available:
        request = {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": device_class}]}
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {"devices": {"requests": [request]}}


def template(device_class: str = "gpu.nvidia.com") -> dict:
    return {"metadata": {"name": "t", "namespace": "loose"}, "spec": {"spec": spec(device_class)}}


def claim(device_class: str = "gpu.nvidia.com", *, made_by_controller: bool = False, **kw) -> dict:
    obj = {"metadata": {"name": "c", "namespace": "loose"}, "spec": spec(device_class, **kw)}
    if made_by_controller:
        obj["metadata"]["annotations"] = {admission.POD_CLAIM_NAME_ANNOTATION: "gpu"}
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}
        ]
    return obj


def decide(user: str, operation: str, plural: str, obj: dict | None, old: dict | None = None, policy=None):
    denied = admission.decide(
        policy or admission.shipped(),
        user=user,
        operation=operation,
        group=GROUP,
        version=VERSION,
        kind=KINDS[plural],
        plural=plural,
        namespace="loose",
        name=(obj or old)["metadata"]["name"],
        obj=obj,
        old=old,
        namespace_obj=LOOSE,
    )
    return None if denied is None else (denied.reason, denied.message)


def test_the_binding_denies_in_every_namespace():
    docs = documents()
    policy, binding = docs["ValidatingAdmissionPolicy"], docs["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == admission.shipped().name
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # no namespaceSelector: labelled or not
    assert policy["spec"]["failurePolicy"] == "Fail"
    constraints = policy["spec"]["matchConstraints"]
    assert constraints["matchPolicy"] == "Equivalent"  # v1beta1/v1beta2 requests are converted to v1 first
    assert {r["resources"][0]: set(r["operations"]) for r in constraints["resourceRules"]} == {
        "resourceclaimtemplates": {"CREATE", "UPDATE", "DELETE"},
        "resourceclaims": {"CREATE"},
    }
    assert all(r["apiGroups"] == [GROUP] and r["apiVersions"] == [VERSION] for r in constraints["resourceRules"])


def test_the_policy_names_the_identities_and_classes_gpuaas_uses():
    variables = dict(admission.shipped().variables)
    assert variables["gpuaas"] == f"'{GPUAAS}'"  # the ServiceAccount deploy/serviceaccounts.yaml binds
    sa = next(d for d in yaml.safe_load_all((MANIFEST.parent / "serviceaccounts.yaml").read_text()) if d)
    assert GPUAAS == f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert f"'{admission.CLAIM_CONTROLLER}'" in variables["claimController"]
    assert f"'{admission.NAMESPACE_CONTROLLER}'" in variables["namespaceController"]
    assert variables["gpuClasses"] == str(sorted(DRA_CLASS.values())).replace('"', "'")


@pytest.mark.parametrize(
    ("user", "operation", "plural", "obj", "old", "refused"),
    [
        ("alice", "CREATE", "resourceclaimtemplates", template(), None, "written by gpuaas only"),
        ("alice", "CREATE", "resourceclaimtemplates", template("mig.nvidia.com"), None, "written by gpuaas only"),
        (GPUAAS, "CREATE", "resourceclaimtemplates", template(), None, None),
        ("alice", "CREATE", "resourceclaimtemplates", template("rdma.example.com"), None, None),
        ("alice", "UPDATE", "resourceclaimtemplates", template(), template(), "written by gpuaas only"),
        ("alice", "DELETE", "resourceclaimtemplates", None, template(), "deleted by gpuaas only"),
        ("kubernetes-admin", "DELETE", "resourceclaimtemplates", None, template(), "deleted by gpuaas only"),
        (GPUAAS, "DELETE", "resourceclaimtemplates", None, template(), None),
        (admission.NAMESPACE_CONTROLLER, "DELETE", "resourceclaimtemplates", None, template(), None),
        ("alice", "DELETE", "resourceclaimtemplates", None, template("rdma.example.com"), None),
        ("alice", "CREATE", "resourceclaims", claim(), None, "made from a pod's resourceClaimTemplateName only"),
        ("alice", "CREATE", "resourceclaims", claim(first_available=True), None, "made from a pod's"),
        ("alice", "CREATE", "resourceclaims", claim(made_by_controller=True), None, "made from a pod's"),
        (admission.CLAIM_CONTROLLER, "CREATE", "resourceclaims", claim(), None, "made from a pod's"),
        (admission.CLAIM_CONTROLLER, "CREATE", "resourceclaims", claim(made_by_controller=True), None, None),
        ("system:kube-controller-manager", "CREATE", "resourceclaims", claim(made_by_controller=True), None, None),
        ("alice", "CREATE", "resourceclaims", claim("rdma.example.com"), None, None),
    ],
)
def test_the_shipped_rules(user, operation, plural, obj, old, refused):
    decision = decide(user, operation, plural, obj, old)
    if refused is None:
        assert decision is None
    else:
        assert decision is not None and decision[0] == "Forbidden" and refused in decision[1]


def test_a_validation_that_fails_to_evaluate_denies_under_fail():
    """failurePolicy Fail: an expression error is a denial (reason Invalid), in cel-go's words."""
    docs = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    docs[0]["spec"]["validations"][0]["expression"] = "object.metadata.nothing == 'x'"
    decision = decide("alice", "CREATE", "resourceclaimtemplates", template(), policy=admission.parse(docs))
    assert decision is not None and decision[0] == "Invalid"
    assert decision[1].startswith("expression 'object.metadata.nothing == 'x'' resulted in error: ")
    docs[0]["spec"]["failurePolicy"] = "Ignore"
    assert decide("alice", "CREATE", "resourceclaimtemplates", template(), policy=admission.parse(docs)) is None
