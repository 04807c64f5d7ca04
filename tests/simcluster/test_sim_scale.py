"""The 2,000-node x 8-GPU scale scenario through the official client (a sanity run, no timing asserts)."""

from __future__ import annotations

import pytest

from simcluster import SimServer, load_scenario
from simcluster.kube import ClusterApi, ListParams


@pytest.fixture(scope="module")
def scale():
    scenario = load_scenario("scale")
    state = scenario.build()
    with SimServer(state, pod_resources=False) as server:  # listing only: no kubelet sockets for 2,000 nodes
        yield scenario, state, server


def test_full_list_and_paging_of_2000_nodes(scale, tmp_path, make_api):
    scenario, state, server = scale
    api = make_api(server.write_kubeconfigs(tmp_path)["scale"])
    expected = scenario.expected_counts()["clusters"]["scale"]
    nodes = api.list_node()
    assert len(nodes.items) == expected["nodes"] == 2000
    assert sum(int(n.metadata.labels["nvidia.com/gpu.count"]) for n in nodes.items) == 16000
    names, token = [], None
    while True:
        page = api.list_node(limit=500, _continue=token, _preload_content=False)
        body = __import__("json").loads(page.data)
        names += [i["metadata"]["name"] for i in body["items"]]
        token = body["metadata"].get("continue")
        if not token:
            break
    assert names == sorted(names) and len(names) == 2000
    tier1 = api.list_node(label_selector="gpuaas.io/tier=1", _preload_content=False)
    assert len(__import__("json").loads(tier1.data)["items"]) == expected["tiers"]["1"]


def test_server_side_list_uses_cached_node_json(scale):
    _, state, _ = scale
    cluster = state.cluster("scale")
    api = ClusterApi(cluster)
    with state.lock:
        first = api.list("nodes", None, ListParams())
        node = cluster.nodes["scale-bal-001"]
        cached = node.json_cache
        assert cached is not None and cached in first
        node.labels["gpuaas.io/touched"] = "yes"
        cluster.touch(node)
        assert node.json_cache is None
        second = api.list("nodes", None, ListParams())
    assert b'"gpuaas.io/touched":"yes"' in second and len(second) > len(first)
