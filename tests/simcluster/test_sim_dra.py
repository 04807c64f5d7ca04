"""DRA mode of the simulator (simcluster/dra.py): the driver's ResourceSlices in the real shape, resource.k8s.io/v1
served to the official client, claims allocated only to devices their class and CEL selectors admit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from simcluster import SimServer, load_scenario
from simcluster.dra import CelError, Selector
from simcluster.kube import ClusterApi
from simcluster.rbac import DEFAULT_USER

FIXTURE = Path(__file__).parent.parent / "fixtures" / "dra" / "nvidia-resourceslices-a100.yaml"
UUID = 'device.attributes["gpu.nvidia.com"].uuid'


@pytest.fixture
def dra_state():
    return load_scenario("dra").build()


@pytest.fixture
def resource_api(dra_state, tmp_path):
    with SimServer(dra_state) as server:
        path = server.write_kubeconfigs(tmp_path)["dra"]
        cfg = type.__call__(client.Configuration)
        config.load_kube_config(config_file=str(path), client_configuration=cfg, persist_config=False)
        cfg.retries = False
        api_client = client.ApiClient(cfg)
        yield client.ResourceV1Api(api_client), client.CoreV1Api(api_client)


def devices(state, node=None):
    cluster = state.cluster("dra")
    return [
        d
        for r in cluster.resourceslices.values()
        for d in r.obj["spec"]["devices"]
        if node is None or r.obj["spec"]["nodeName"] == node
    ]


def template(name, device_class, expression=None):
    exactly = {"deviceClassName": device_class}
    if expression:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    requests = [{"name": "gpu", "exactly": exactly}]
    return {"metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": requests}}}}


def pod(name, template_name=None, claim_name=None):
    ref = {
        "name": "gpu",
        **({"resourceClaimTemplateName": template_name} if template_name else {}),
        **({"resourceClaimName": claim_name} if claim_name else {}),
    }
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [ref],
        },
    }


def allocated_uuid(state, namespace, pod_name):
    cluster = state.cluster("dra")
    obj = cluster.pods[(namespace, pod_name)].obj
    names = [s["resourceClaimName"] for s in obj["status"].get("resourceClaimStatuses") or ()]
    names += [c["resourceClaimName"] for c in obj["spec"]["resourceClaims"] if c.get("resourceClaimName")]
    by_name = {
        (d["name"], r.obj["spec"]["pool"]["name"]): d["attributes"]["uuid"]["string"]
        for r in cluster.resourceslices.values()
        for d in r.obj["spec"]["devices"]
    }
    uuids = []
    for name in names:
        allocation = cluster.resourceclaims[(namespace, name)].obj.get("status", {}).get("allocation")
        for result in (allocation or {}).get("devices", {}).get("results", []):
            uuids.append(by_name[(result["device"], result["pool"])])
    return uuids


def test_slices_have_the_fixture_shape(dra_state):
    """Every attribute and capacity name of the recorded slice (per device type) is one the simulator publishes,
    with the same value kinds (string / version)."""
    recorded = yaml.safe_load(FIXTURE.read_text())["items"]
    published = {d["attributes"]["type"]["string"]: d for d in devices(dra_state)}
    assert set(published) == {"gpu", "mig"}
    for item in recorded:
        assert item["apiVersion"] == "resource.k8s.io/v1" and item["spec"]["driver"] == "gpu.nvidia.com"
        for device in item["spec"]["devices"]:
            ours = published[device["attributes"]["type"]["string"]]
            assert {k: set(v) for k, v in device["attributes"].items()} == {
                k: set(v) for k, v in ours["attributes"].items()
            }
            assert {k.rstrip("0123456789") for k in device["capacity"]} == {
                k.rstrip("0123456789") for k in ours["capacity"]
            }
    cluster = dra_state.cluster("dra")
    mig_node = cluster.nodes["dra-h100-mig-01"]
    mig = [d for d in devices(dra_state, "dra-h100-mig-01")]
    assert sorted(d["attributes"]["uuid"]["string"] for d in mig) == sorted(
        ci.uuid for gpu in mig_node.gpus for _, ci in gpu.mig_devices()
    )
    assert {d["name"] for d in mig} == {"gpu-0-mig-9-0-4", "gpu-0-mig-9-4-4", "gpu-1-mig-9-0-4", "gpu-1-mig-9-4-4"}
    assert {d["name"] for d in devices(dra_state, "dra-h100-full-01")} == {"gpu-0", "gpu-1"}


def test_device_plugin_is_off_under_dra(dra_state):
    node = dra_state.cluster("dra").nodes["dra-h100-full-01"]
    assert node.devices == {}
    assert node.labels["nvidia.com/gpu.count"] == "2"  # GFD still labels


def test_official_client_reads_slices_classes_and_discovery(resource_api, dra_state):
    resource, core = resource_api
    slices = resource.list_resource_slice(field_selector="spec.nodeName=dra-h100-mig-01")
    assert [s.spec.node_name for s in slices.items] == ["dra-h100-mig-01"]
    assert slices.items[0].spec.devices[0].attributes["type"].string == "mig"
    assert sorted(c.metadata.name for c in resource.list_device_class().items) == ["gpu.nvidia.com", "mig.nvidia.com"]
    groups = client.ApisApi(core.api_client).get_api_versions()
    assert [g.name for g in groups.groups] == [
        "scheduling.k8s.io",
        "apps",
        "rbac.authorization.k8s.io",
        "admissionregistration.k8s.io",
        "nvidia.com",
        "resource.k8s.io",
        "kubevirt.io",
    ]
    listed = resource.get_api_resources()
    assert {r.name for r in listed.resources} == {
        "deviceclasses",
        "resourceclaims",
        "resourceclaimtemplates",
        "resourceslices",
    }


def test_template_pod_gets_only_an_admitted_device_and_waits_when_none_is_left(resource_api, dra_state):
    resource, core = resource_api
    core.create_namespace({"metadata": {"name": "team-a"}})
    mine = sorted(d["attributes"]["uuid"]["string"] for d in devices(dra_state, "dra-h100-mig-02"))[:2]
    expression = f"{UUID} in [{', '.join(repr(u) for u in mine)}]"
    resource.create_namespaced_resource_claim_template("team-a", template("mine", "mig.nvidia.com", expression))
    for name in ("p1", "p2", "p3"):
        core.create_namespaced_pod("team-a", pod(name, "mine"))
    got = allocated_uuid(dra_state, "team-a", "p1") + allocated_uuid(dra_state, "team-a", "p2")
    assert sorted(got) == mine
    waiting = core.read_namespaced_pod("p3", "team-a")
    assert waiting.status.phase == "Pending"
    condition = waiting.status.conditions[0]
    assert (condition.type, condition.status, condition.reason) == ("PodScheduled", "False", "Unschedulable")
    assert condition.message == "0/4 nodes are available: 4 cannot allocate all claims."
    claims = resource.list_namespaced_resource_claim("team-a").items
    assert len(claims) == 3
    allocated = [c for c in claims if c.status and c.status.allocation]
    assert {r.driver for c in allocated for r in c.status.allocation.devices.results} == {"gpu.nvidia.com"}
    # The first pod ends: its claim goes with it, and the waiting pod gets the freed device.
    first = allocated_uuid(dra_state, "team-a", "p1")
    core.delete_namespaced_pod("p1", "team-a")
    assert allocated_uuid(dra_state, "team-a", "p3") == first
    assert core.read_namespaced_pod("p3", "team-a").status.phase == "Running"
    assert len(resource.list_namespaced_resource_claim("team-a").items) == 2


def test_a_device_held_by_one_claim_is_never_given_to_another(dra_state):
    """The allocator's own guarantee, without the admission policy (which refuses the forged claim first:
    tests/simcluster/test_sim_admission_policy.py)."""
    cluster = dra_state.cluster("dra")
    cluster.settings.admission_policy = False
    api = ClusterApi(cluster)
    for ns in ("team-a", "team-b"):
        api.create("namespaces", None, {"metadata": {"name": ns}})
    target = devices(dra_state, "dra-h100-full-02")[0]["attributes"]["uuid"]["string"]
    api.create("resourceclaimtemplates", "team-a", template("a", "gpu.nvidia.com", f"{UUID} == '{target}'"))
    api.create("pods", "team-a", pod("owner", "a"))
    assert allocated_uuid(dra_state, "team-a", "owner") == [target]
    # A claim written by hand in another namespace that names the same device cannot have it.
    api.create(
        "resourceclaims",
        "team-b",
        {
            "metadata": {"name": "forged"},
            "spec": template("x", "gpu.nvidia.com", f"{UUID} in ['{target}']")["spec"]["spec"],
        },
    )
    api.create("pods", "team-b", pod("thief", claim_name="forged"))
    thief = cluster.pods[("team-b", "thief")].obj
    assert thief["status"]["phase"] == "Pending"
    assert "cannot allocate all claims" in thief["status"]["conditions"][0]["message"]
    # A template from another namespace cannot be referenced at all.
    api.create("pods", "team-b", pod("borrower", "a"))
    borrower = cluster.pods[("team-b", "borrower")].obj
    assert borrower["status"]["conditions"][0]["message"] == (
        '0/4 nodes are available: resourceclaimtemplate.resource.k8s.io "a" not found.'
    )


def test_mig_class_never_admits_a_whole_gpu(dra_state):
    cluster = dra_state.cluster("dra")
    api = ClusterApi(cluster, user=DEFAULT_USER)  # gpuaas writes templates that request a GPU class
    api.create("namespaces", None, {"metadata": {"name": "team-a"}})
    whole = devices(dra_state, "dra-h100-full-01")[0]["attributes"]["uuid"]["string"]
    api.create("resourceclaimtemplates", "team-a", template("t", "mig.nvidia.com", f"{UUID} == '{whole}'"))
    api.create("pods", "team-a", pod("p", "t"))
    assert cluster.pods[("team-a", "p")].obj["status"]["phase"] == "Pending"


@pytest.mark.parametrize(
    "expression",
    [
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',  # a Kubernetes library
        "cel.bind(x, 1, true)",  # cel-go's bindings extension
        f"{UUID} in ",  # does not parse
        "device.name == 'x'",  # no such field of device
        "request.userInfo.username == 'x'",  # not declared for a selector
    ],
)
def test_cel_the_library_cannot_run_is_refused_when_written(resource_api, expression):
    resource, core = resource_api
    core.create_namespace({"metadata": {"name": "team-a"}})
    with pytest.raises(ApiException) as refused:
        resource.create_namespaced_resource_claim_template("team-a", template("t", "mig.nvidia.com", expression))
    assert refused.value.status == 422
    assert "compilation failed" in refused.value.body
    assert resource.list_namespaced_resource_claim_template("team-a").items == []


def test_standard_cel_beyond_the_old_subset_is_evaluated(resource_api, dra_state):
    """Macros, string functions and has() run through the CEL library: the template is stored and admits the
    devices the expression says."""
    resource, core = resource_api
    core.create_namespace({"metadata": {"name": "team-a"}})
    expression = (
        'device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA") && '
        'has(device.attributes["gpu.nvidia.com"].uuid) && '
        '["mig"].exists(t, t == device.attributes["gpu.nvidia.com"].type)'
    )
    resource.create_namespaced_resource_claim_template("team-a", template("t", "mig.nvidia.com", expression))
    mig = [d for d in devices(dra_state) if d["attributes"]["type"]["string"] == "mig"]
    assert mig and all(Selector(expression).admits("gpu.nvidia.com", d) for d in mig)
    whole = [d for d in devices(dra_state) if d["attributes"]["type"]["string"] == "gpu"]
    assert whole and not any(Selector(expression).admits("gpu.nvidia.com", d) for d in whole)


def test_cel_semantics():
    device = {"attributes": {"uuid": {"string": "MIG-1"}, "type": {"string": "mig"}, "index": {"int": 3}}}
    admits = lambda text: Selector(text).admits("gpu.nvidia.com", device)  # noqa: E731
    assert admits(f"{UUID} in ['MIG-2', 'MIG-1']")
    assert not admits(f"{UUID} in ['MIG-2']")
    assert admits("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'")
    assert admits(f"({UUID} == 'x' || {UUID} == 'MIG-1') && !(device.attributes['gpu.nvidia.com'].index == 4)")
    assert not admits("device.attributes['gpu.nvidia.com'].profile == '3g.40gb'")  # missing: never admitted
    assert not admits("device.attributes['other.example.com'].uuid == 'MIG-1'")
    assert not Selector(f"{UUID} == 'MIG-1'").admits("other.example.com", device)
    with pytest.raises(CelError):
        Selector("device.name == 'x'")


def test_templates_are_immutable_and_a_claim_template_watch_sees_changes(resource_api):
    resource, core = resource_api
    core.create_namespace({"metadata": {"name": "team-a"}})
    created = resource.create_namespaced_resource_claim_template("team-a", template("t", "gpu.nvidia.com"))
    body = template("t", "mig.nvidia.com")
    body["metadata"]["resourceVersion"] = created.metadata.resource_version
    with pytest.raises(ApiException) as refused:
        resource.replace_namespaced_resource_claim_template("t", "team-a", body)
    assert refused.value.status == 422 and "field is immutable" in refused.value.body
    resource.delete_namespaced_resource_claim_template("t", "team-a")
    from kubernetes import watch

    events = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            resource.list_namespaced_resource_claim_template,
            "team-a",
            resource_version=created.metadata.resource_version,
            timeout_seconds=1,
        )
    ]
    assert events == [("DELETED", "t")]


def test_a_mig_reconfiguration_republishes_the_slice(dra_state):
    from simcluster import gpuoperator

    cluster = dra_state.cluster("dra")
    node = cluster.nodes["dra-h100-full-01"]
    record = next(r for r in cluster.resourceslices.values() if r.obj["spec"]["nodeName"] == node.name)
    assert record.obj["spec"]["pool"]["generation"] == 1
    ok, message = gpuoperator.apply_mig_config(cluster, node, "all-1g.10gb")
    assert ok, message
    gpuoperator.refresh_node(cluster, node)
    record = next(r for r in cluster.resourceslices.values() if r.obj["spec"]["nodeName"] == node.name)
    assert record.obj["spec"]["pool"]["generation"] == 2
    assert {d["attributes"]["profile"]["string"] for d in record.obj["spec"]["devices"]} == {"1g.10gb"}
