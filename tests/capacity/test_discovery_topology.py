"""GPU topology per product: what the simulator's NVML answers, and the groups discovery derives from it.

Facts (docs/tiers.md, "Topology facts"): HGX boards (H100/H200 SXM: 18 NVLinks to 4 NVSwitches; A100 SXM4:
12 to 6) join all 8 GPUs, each link ending on a switch; PCIe cards (H100 PCIe, H100 NVL, H200 NVL, A100 PCIe,
A30) are bridged in pairs, each link ending on the partner GPU. PCIe: pairs under one switch, half the
GPUs per NUMA node (simulator values).
"""

import pynvml
import pytest

from capacity.adapters import nvml
from simcluster import Scenario, SimServer, library_for_state

# product -> (GPUs per node, NVLinks per GPU, NVSwitches on the board (0: bridged pairs))
PRODUCTS = {
    "H100-80GB": (8, 18, 4),
    "H200-141GB": (8, 18, 4),
    "A100-80GB": (8, 12, 6),
    "A100-40GB": (8, 12, 6),
    "H100-80GB-PCIE": (8, 12, 0),
    "H100-94GB-NVL": (8, 12, 0),
    "H200-141GB-NVL": (8, 18, 0),
    "A100-80GB-PCIE": (8, 12, 0),
    "A100-40GB-PCIE": (4, 12, 0),
    "A30-24GB": (4, 4, 0),
}


def _node(product: str) -> str:
    return product.lower().replace("-", "") + "-01"


@pytest.fixture(scope="module")
def state():
    groups = [
        {"name_prefix": product.lower().replace("-", ""), "product": product, "gpus_per_node": gpus}
        for product, (gpus, _, _) in PRODUCTS.items()
    ]
    return Scenario.from_dict({"name": "topo", "clusters": [{"name": "c", "node_groups": groups}]}).build()


@pytest.fixture(scope="module")
def server(state):
    with SimServer(state) as running:
        yield running


@pytest.mark.parametrize("product", PRODUCTS)
def test_the_simulators_nvlink_follows_the_product(state, product):
    gpus, links, switches = PRODUCTS[product]
    lib = library_for_state(state, "c", _node(product))
    lib.nvmlInit()
    try:
        h = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
        bus = [lib.nvmlDeviceGetPciInfo(x).busId for x in h]
        assert [lib.nvmlDeviceGetNvLinkState(h[0], link) for link in range(links)] == [1] * links
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            lib.nvmlDeviceGetNvLinkState(h[0], links)
        ends = {lib.nvmlDeviceGetNvLinkRemotePciInfo(h[0], link).busId for link in range(links)}
        kinds = {lib.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], link) for link in range(links)}
        if switches:
            assert len(ends) == switches and not ends & set(bus)  # every link ends on an NVSwitch
            assert kinds == {pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH}
            assert ends == {lib.nvmlDeviceGetNvLinkRemotePciInfo(h[-1], link).busId for link in range(links)}
        else:
            assert ends == {bus[1]}  # all links over the bridge to the partner
            assert kinds == {pynvml.NVML_NVLINK_DEVICE_TYPE_GPU}
            assert {lib.nvmlDeviceGetNvLinkRemotePciInfo(h[3], link).busId for link in range(links)} == {bus[2]}
    finally:
        lib.nvmlShutdown()


@pytest.mark.parametrize("product", PRODUCTS)
def test_the_simulators_pcie_tree_pairs_gpus_under_a_switch_and_splits_them_over_two_sockets(state, product):
    gpus = PRODUCTS[product][0]
    lib = library_for_state(state, "c", _node(product))
    lib.nvmlInit()
    try:
        h = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
        level = lib.nvmlDeviceGetTopologyCommonAncestor
        assert level(h[0], h[1]) == pynvml.NVML_TOPOLOGY_SINGLE
        assert level(h[0], h[gpus - 1]) == pynvml.NVML_TOPOLOGY_SYSTEM
        if gpus == 8:
            assert level(h[0], h[3]) == pynvml.NVML_TOPOLOGY_NODE
            assert level(h[3], h[4]) == pynvml.NVML_TOPOLOGY_SYSTEM
    finally:
        lib.nvmlShutdown()


@pytest.mark.parametrize("product", PRODUCTS)
def test_discovery_derives_the_groups_from_remote_pci_info_and_the_common_ancestor(server, product):
    gpus, _, switches = PRODUCTS[product]
    inventory = nvml.node_inventory(server.cluster_url("c"), _node(product))
    if switches:
        assert [g.nvlink_group for g in inventory.gpus] == [0] * gpus
    else:
        assert [g.nvlink_group for g in inventory.gpus] == [i - i % 2 for i in range(gpus)]
    assert [g.pcie_group for g in inventory.gpus] == [i - i % 2 for i in range(gpus)]
    assert [g.numa_group for g in inventory.gpus] == [0] * (gpus // 2) + [gpus // 2] * (gpus // 2)


def test_a_gpu_whose_links_are_down_leaves_its_nvlink_group(state, server):
    node = state.cluster("c").nodes[_node("H100-94GB-NVL")]
    hgx = state.cluster("c").nodes[_node("H100-80GB")]
    with state.lock:
        node.gpus[2].nvlink_down = True  # its bridge failed: GPU 3 has no active NVLink peer either
        hgx.gpus[0].nvlink_down = True
    try:
        nvl = nvml.node_inventory(server.cluster_url("c"), node.name).gpus
        assert [g.nvlink_group for g in nvl] == [0, 0, None, None, 4, 4, 6, 6]
        board = nvml.node_inventory(server.cluster_url("c"), hgx.name).gpus
        assert [g.nvlink_group for g in board] == [None] + [1] * 7
    finally:
        with state.lock:
            node.gpus[2].nvlink_down = hgx.gpus[0].nvlink_down = False
