"""Nodes through the official client: selectors, paging, patches, cordon, errors."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from simcluster import kube

DEMO_PROD_NODES = [
    "prod-h100-4g3g-01",
    "prod-h100-4g3g-02",
    "prod-h100-bal-01",
    "prod-h100-bal-02",
    "prod-h100-full-01",
    "prod-h100-full-02",
]


def names(node_list) -> list[str]:
    return [n.metadata.name for n in node_list.items]


def test_list_nodes_sorted_with_list_resource_version(prod, state):
    nodes = prod.list_node()
    assert names(nodes) == DEMO_PROD_NODES
    assert nodes.metadata.resource_version == str(state.cluster("prod").rv)
    node = nodes.items[0]
    assert node.metadata.uid and node.metadata.creation_timestamp is not None
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert ready[0].status == "True"
    assert node.status.node_info.kubelet_version == "v1.31.4"


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("gpuaas.io/tier=1", ["prod-h100-bal-01", "prod-h100-bal-02"]),
        ("gpuaas.io/tier==full", ["prod-h100-full-01", "prod-h100-full-02"]),
        ("gpuaas.io/tier!=1", ["prod-h100-4g3g-01", "prod-h100-4g3g-02", "prod-h100-full-01", "prod-h100-full-02"]),
        ("gpuaas.io/tier in (1, 2)", DEMO_PROD_NODES[:4]),
        ("gpuaas.io/tier notin (1,2)", ["prod-h100-full-01", "prod-h100-full-02"]),
        ("nvidia.com/mig-4g.40gb.count", ["prod-h100-4g3g-01", "prod-h100-4g3g-02"]),
        ("!nvidia.com/mig-3g.40gb.count", ["prod-h100-full-01", "prod-h100-full-02"]),
        ("topology.kubernetes.io/zone=zone-a,gpuaas.io/tier=2", ["prod-h100-4g3g-01", "prod-h100-4g3g-02"]),
        ("nvidia.com/gpu.count>7", DEMO_PROD_NODES),
        ("gpuaas.io/tier=3", []),
    ],
)
def test_label_selectors(prod, selector, expected):
    assert names(prod.list_node(label_selector=selector)) == expected


def test_bad_label_selector_is_400(prod):
    with pytest.raises(ApiException) as exc:
        prod.list_node(label_selector="a in b")
    assert exc.value.status == 400


def test_field_selector_on_nodes(prod):
    assert names(prod.list_node(field_selector="metadata.name=prod-h100-bal-02")) == ["prod-h100-bal-02"]
    with pytest.raises(ApiException) as exc:
        prod.list_node(field_selector="spec.bogus=1")
    assert exc.value.status == 400
    assert "field label not supported: spec.bogus" in exc.value.body


def test_paging_with_limit_and_continue(prod):
    seen, token, pages = [], None, 0
    while True:
        page = prod.list_node(limit=4, _continue=token)
        pages += 1
        seen += names(page)
        token = page.metadata._continue
        if pages == 1:
            assert page.metadata.remaining_item_count == 2
        if not token:
            break
    assert seen == DEMO_PROD_NODES
    assert pages == 2


def test_paging_with_selector_never_ends_on_an_empty_page(prod):
    page = prod.list_node(limit=2, label_selector="gpuaas.io/tier in (1,full)")
    assert names(page) == ["prod-h100-bal-01", "prod-h100-bal-02"]
    page = prod.list_node(limit=2, label_selector="gpuaas.io/tier in (1,full)", _continue=page.metadata._continue)
    assert names(page) == ["prod-h100-full-01", "prod-h100-full-02"]
    assert page.metadata._continue is None


def test_garbage_continue_token_is_400(prod):
    with pytest.raises(ApiException) as exc:
        prod.list_node(limit=2, _continue="!!!not-a-token")
    assert exc.value.status == 400


def test_get_node_and_404_status_body(prod):
    assert prod.read_node("prod-h100-bal-01").metadata.name == "prod-h100-bal-01"
    with pytest.raises(ApiException) as exc:
        prod.read_node("nope")
    assert exc.value.status == 404
    body = kube.json.loads(exc.value.body)
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'nodes "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "kind": "nodes"},
        "code": 404,
    }


def test_strategic_merge_patch_labels_and_null_deletes(prod):
    before = prod.read_node("prod-h100-bal-01")
    patched = prod.patch_node(
        "prod-h100-bal-01", {"metadata": {"labels": {"gpuaas.io/pool": "inference", "gpuaas.io/tier": None}}}
    )
    assert patched.metadata.labels["gpuaas.io/pool"] == "inference"
    assert "gpuaas.io/tier" not in patched.metadata.labels
    assert int(patched.metadata.resource_version) > int(before.metadata.resource_version)
    assert prod.read_node("prod-h100-bal-01").metadata.labels["gpuaas.io/pool"] == "inference"


def test_merge_patch_annotations(prod):
    patched = prod.patch_node(
        "prod-h100-bal-02",
        {"metadata": {"annotations": {"gpuaas.io/owner": "ops"}}},
        _content_type="application/merge-patch+json",
    )
    assert patched.metadata.annotations["gpuaas.io/owner"] == "ops"
    assert patched.metadata.annotations["node.alpha.kubernetes.io/ttl"] == "0"


def test_json_patch(prod):
    patched = prod.patch_node(
        "prod-h100-bal-02",
        [
            {"op": "add", "path": "/metadata/labels/gpuaas.io~1drain", "value": "yes"},
        ],
    )
    assert patched.metadata.labels["gpuaas.io/drain"] == "yes"


def test_cordon_and_uncordon_sync_the_taint(prod):
    cordoned = prod.patch_node("prod-h100-full-02", {"spec": {"unschedulable": True}})
    assert cordoned.spec.unschedulable is True
    assert [t.key for t in cordoned.spec.taints] == ["node.kubernetes.io/unschedulable"]
    assert names(prod.list_node(field_selector="spec.unschedulable=true")) == ["prod-h100-full-02"]
    uncordoned = prod.patch_node("prod-h100-full-02", {"spec": {"unschedulable": None}})
    assert not uncordoned.spec.unschedulable
    assert not uncordoned.spec.taints


def test_invalid_label_is_422(prod):
    with pytest.raises(ApiException) as exc:
        prod.patch_node("prod-h100-full-01", {"metadata": {"labels": {"gpuaas.io/tier": "not ok!"}}})
    assert exc.value.status == 422
    body = kube.json.loads(exc.value.body)
    assert body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.labels"
    assert prod.read_node("prod-h100-full-01").metadata.labels["gpuaas.io/tier"] == "full"


def test_patch_with_stale_resource_version_conflicts(prod):
    node = prod.read_node("prod-h100-full-01")
    prod.patch_node("prod-h100-full-01", {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(ApiException) as exc:
        prod.patch_node(
            "prod-h100-full-01", {"metadata": {"resourceVersion": node.metadata.resource_version, "labels": {"a": "2"}}}
        )
    assert exc.value.status == 409
    assert kube.json.loads(exc.value.body)["reason"] == "Conflict"


def test_clusters_are_separate_and_root_is_the_first(server, prod, dev):
    assert [n.metadata.name for n in dev.list_node().items] == ["dev-h200-ts-01", "dev-h200-ts-02"]
    import urllib.request

    with urllib.request.urlopen(f"{server.url}/api/v1/nodes") as response:
        root = kube.json.loads(response.read())
    assert [i["metadata"]["name"] for i in root["items"]] == DEMO_PROD_NODES


def test_token_is_enforced_when_configured(state, tmp_path, make_api):
    from simcluster import SimServer, write_kubeconfig

    core_api = make_api
    with SimServer(state, token="s3cret") as srv:
        good = core_api(write_kubeconfig(tmp_path / "good", srv.url, token="s3cret"))
        bad = core_api(write_kubeconfig(tmp_path / "bad", srv.url, token="wrong"))
        assert good.list_node().items
        with pytest.raises(ApiException) as exc:
            bad.list_node()
        assert exc.value.status == 401
