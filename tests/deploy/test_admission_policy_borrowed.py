"""deploy/admission-policy-borrowed.yaml is what the simulator enforces: its CEL evaluated as written by
simcluster/admission.py (the engine of deploy/admission-policy.yaml), so the simulator refuses a borrower's GPU
pod without the borrowed PriorityClass where provisioning labelled the namespace (docs/queue.md, Borrowing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pools.provisioning import BORROWED_PRIORITY_CLASS, BORROWING_LABEL
from simcluster import admission

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "admission-policy-borrowed.yaml"


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


MESSAGE = (
    "this project runs on borrowed GPU units only: pods that request GPUs must set priorityClassName: gpuaas-borrowed"
)
REFUSAL = (
    "pods \"plain\" is forbidden: ValidatingAdmissionPolicy 'gpuaas-borrowed-pods' with binding "
    f"'gpuaas-borrowed-pods' denied request: {MESSAGE}"
)


def test_the_simulator_loads_the_manifest_as_written():
    docs = documents()
    policy, binding = docs["ValidatingAdmissionPolicy"], docs["ValidatingAdmissionPolicyBinding"]
    loaded = admission.borrowed()
    assert loaded in admission.policies() and loaded != admission.shipped()
    assert (loaded.name, loaded.binding, loaded.actions) == ("gpuaas-borrowed-pods", "gpuaas-borrowed-pods", ("Deny",))
    assert binding["spec"]["policyName"] == loaded.name
    # the label provisioning sets is the one the binding selects, and the class it names the one pods get
    assert loaded.namespace_selector == {"matchLabels": {BORROWING_LABEL: "only"}}
    assert loaded.failure_policy == "Fail"
    (validation,) = loaded.validations
    assert f"object.spec.priorityClassName == '{BORROWED_PRIORITY_CLASS}'" in validation.expression
    assert (validation.message, validation.reason) == (MESSAGE, "Forbidden")
    assert loaded.variables == tuple((v["name"], v["expression"]) for v in policy["spec"]["variables"])


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
        assert (refused.value.reason, refused.value.message) == ("Forbidden", REFUSAL)
        assert ("lent", "plain") not in cluster.pods
        assert api.create("pods", "lent", pod("ok", priority=BORROWED_PRIORITY_CLASS))[0] == 201
        assert api.create("pods", "lent", pod("cpu", gpu=False))[0] == 201  # no GPU: not the policy's business
        assert api.create("pods", "own", pod("own"))[0] == 201  # an unlabelled namespace: its own units


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        (
            {
                "initContainers": [
                    {"name": "i", "image": "cuda", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}
                ]
            },
            True,
        ),
        ({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "pool-7"}]}, True),
        ({"containers": [{"name": "m", "image": "cuda", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}, True),
        ({"containers": [{"name": "m", "image": "cuda", "resources": {"limits": {"cpu": "1"}}}]}, False),
        ({"containers": [{"name": "m", "image": "cuda"}]}, False),
    ],
)
def test_what_counts_as_a_gpu_pod_is_the_manifests_cel(cluster, spec, refused):
    from simcluster.kube import ApiError

    cluster, api = cluster
    spec = {"containers": [{"name": "m", "image": "cuda"}]} | spec
    with cluster.state.lock:
        if refused:
            with pytest.raises(ApiError) as denied:
                api.create("pods", "lent", {"metadata": {"name": "plain"}, "spec": spec})
            assert denied.value.message == REFUSAL
        else:
            assert api.create("pods", "lent", {"metadata": {"name": "plain"}, "spec": spec})[0] == 201


def test_kube_apiserver_refusal_through_the_http_api(tmp_path):
    """The official client against the simulated kube-apiserver: a 403 Status with kube-apiserver's text."""
    import json

    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    from simcluster import SimServer
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
    with SimServer(state) as server:
        cfg = type.__call__(client.Configuration)
        config.load_kube_config(
            config_file=str(server.write_kubeconfigs(tmp_path / "kube")["b"]),
            client_configuration=cfg,
            persist_config=False,
        )
        cfg.retries = False
        core = client.CoreV1Api(client.ApiClient(cfg))
        core.create_namespace({"metadata": {"name": "lent", "labels": {BORROWING_LABEL: "only"}}})
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod("lent", pod("plain"))
        status = json.loads(refused.value.body)
        assert refused.value.status == 403
        assert (status["kind"], status["status"], status["reason"], status["code"]) == (
            "Status",
            "Failure",
            "Forbidden",
            403,
        )
        assert status["message"] == REFUSAL
        assert core.list_namespaced_pod("lent").items == []
        created = core.create_namespaced_pod("lent", pod("ok", priority=BORROWED_PRIORITY_CLASS))
        assert created.spec.priority_class_name == BORROWED_PRIORITY_CLASS
