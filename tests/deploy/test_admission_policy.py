"""deploy/admission-policy.yaml says what the simulator enforces (simcluster/admission.py), so the tests and
`bench dra` that run with the policy on test the rules a cluster installed from deploy/ has."""

from __future__ import annotations

from pathlib import Path

import yaml

from pools.provisioning import MANAGED_BY
from simcluster import admission
from simcluster.rbac import DEFAULT_USER

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "admission-policy.yaml"


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


def test_policy_and_binding_match_the_simulators_rules():
    docs = documents()
    policy, binding = docs["ValidatingAdmissionPolicy"], docs["ValidatingAdmissionPolicyBinding"]
    assert (policy["metadata"]["name"], binding["metadata"]["name"]) == (admission.POLICY, admission.BINDING)
    assert binding["spec"]["policyName"] == admission.POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    # The namespaces provisioning labels are the ones the binding selects.
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": admission.NAMESPACE_LABELS}
    assert admission.NAMESPACE_LABELS == MANAGED_BY
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {r["resources"][0]: set(r["operations"]) for r in rules} == admission.OPERATIONS
    assert all(r["apiGroups"] == [admission.GROUP] and r["apiVersions"] == ["*"] for r in rules)


def test_each_validation_names_who_may_write_and_says_so():
    templates, claims = documents()["ValidatingAdmissionPolicy"]["spec"]["validations"]
    assert admission.TEMPLATE_WRITER == DEFAULT_USER  # the ServiceAccount deploy/ binds the ClusterRole to
    assert f"request.userInfo.username == '{admission.TEMPLATE_WRITER}'" in templates["expression"]
    assert f"request.userInfo.username == '{admission.CLAIM_CONTROLLER}'" in claims["expression"]
    assert f"'{admission.POD_CLAIM_NAME_ANNOTATION}' in object.metadata.annotations" in claims["expression"]
    assert "o.kind == 'Pod'" in claims["expression"] and "o.controller" in claims["expression"]
    assert (templates["message"], claims["message"]) == (
        admission.MESSAGES["resourceclaimtemplates"],
        admission.MESSAGES["resourceclaims"],
    )
    assert templates["reason"] == claims["reason"] == "Forbidden"  # 403, as the simulator answers
