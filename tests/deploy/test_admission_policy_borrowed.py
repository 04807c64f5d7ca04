"""deploy/admission-policy-borrowed.yaml says what the simulator enforces (simcluster/borrowed.py), and the
simulator refuses a borrower's GPU pod without the borrowed PriorityClass where provisioning labelled the
namespace (docs/queue.md, Borrowing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pools.provisioning import BORROWED_PRIORITY_CLASS, BORROWING_LABEL
from simcluster import borrowed

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "admission-policy-borrowed.yaml"


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


def test_policy_and_binding_match_the_simulators_rule():
    docs = documents()
    policy, binding = docs["ValidatingAdmissionPolicy"], docs["ValidatingAdmissionPolicyBinding"]
    assert (policy["metadata"]["name"], binding["metadata"]["name"]) == (borrowed.POLICY, borrowed.BINDING)
    assert binding["spec"]["policyName"] == borrowed.POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert borrowed.NAMESPACE_LABEL == (BORROWING_LABEL, "only")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": dict([borrowed.NAMESPACE_LABEL])}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == ([""], ["pods"], ["CREATE"])
    (validation,) = policy["spec"]["validations"]
    assert borrowed.PRIORITY_CLASS == BORROWED_PRIORITY_CLASS
    assert f"object.spec.priorityClassName == '{BORROWED_PRIORITY_CLASS}'" in validation["expression"]
    assert (validation["message"], validation["reason"]) == (borrowed.MESSAGE, "Forbidden")
    wants = policy["spec"]["variables"][0]["expression"]
    assert "resourceClaims" in wants and "startsWith('nvidia.com/')" in wants and "initContainers" in wants


def test_the_kustomization_ships_it():
    kustomization = yaml.safe_load((MANIFEST.parent / "kustomization.yaml").read_text())
    assert MANIFEST.name in kustomization["resources"]


@pytest.fixture
def cluster():
    from simcluster.kube import ClusterApi
    from simcluster.scenarios import Scenario

    state = Scenario.from_dict(
        {
            "name": "b",
            "clusters": [
                {
                    "name": "b",
                    "admission_policy": True,
                    "node_groups": [{"name_prefix": "n", "count": 1, "product": "H100-80GB", "gpus_per_node": 1}],
                }
            ],
        }
    ).build()
    cluster = state.cluster("b")
    api = ClusterApi(cluster)
    with state.lock:
        api.create("namespaces", None, {"metadata": {"name": "lent", "labels": {BORROWING_LABEL: "only"}}})
        api.create("namespaces", None, {"metadata": {"name": "own"}})
    return cluster, api


def pod(name: str, *, priority: str = "", gpu: bool = True) -> dict:
    limits = {"nvidia.com/gpu": "1"} if gpu else {}
    spec = {"containers": [{"name": "m", "image": "cuda", "resources": {"limits": limits}}]}
    if priority:
        spec["priorityClassName"] = priority
    return {"metadata": {"name": name}, "spec": spec}


def test_the_simulator_refuses_a_borrowers_gpu_pod_without_the_borrowed_class(cluster):
    from simcluster.kube import ApiError

    cluster, api = cluster
    with cluster.state.lock:
        with pytest.raises(ApiError) as refused:
            api.create("pods", "lent", pod("plain"))
        assert refused.value.code == 403
        assert borrowed.MESSAGE in refused.value.message and borrowed.POLICY in refused.value.message
        assert ("lent", "plain") not in cluster.pods
        assert api.create("pods", "lent", pod("ok", priority=BORROWED_PRIORITY_CLASS))[0] == 201
        assert api.create("pods", "lent", pod("cpu", gpu=False))[0] == 201  # no GPU: not the policy's business
        assert api.create("pods", "own", pod("own"))[0] == 201  # an unlabelled namespace: its own units
