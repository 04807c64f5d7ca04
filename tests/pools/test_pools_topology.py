"""Whole GPUs for multi-GPU work sit on one node: never split while one node can hold the request."""

import pytest

from capacity.models import GpuCapacity
from capacity.services.clusters import register_cluster
from capacity.services.discovery import discover_cluster
from pools import services
from pools.exceptions import InsufficientCapacity
from pools.models import Allocation
from pools.units import topology
from simcluster import Scenario, SimServer

pytestmark = pytest.mark.django_db


def full_request(make_request, count):
    return make_request(isolation="full", product="H100-80GB", profile_name="", count=count, workload_type="training")


def test_four_gpus_never_split_while_one_node_holds_them(fleet, make_request, operator):
    fleet.full_node("a-small", gpus=2)
    fleet.full_node("b-eight", gpus=8)
    fleet.full_node("c-four", gpus=4)
    pool = services.approve(full_request(make_request, 4), actor=operator)
    nodes = set(Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True))
    assert nodes == {"c-four"}  # best fit: the node left with no spare GPUs
    assert pool.placement == "4 whole GPUs on one node (c-four)"
    second = services.approve(full_request(make_request, 4), actor=operator)
    assert set(Allocation.objects.filter(pool=second).values_list("gpu__node__name", flat=True)) == {"b-eight"}


def test_no_node_with_four_free_says_which_node_would(fleet, make_request, operator):
    fleet.full_node("a", gpus=2)
    fleet.full_node("b", gpus=4)
    services.approve(full_request(make_request, 2), actor=operator)  # best fit: all of a
    services.approve(full_request(make_request, 1), actor=operator)  # one of b
    request = full_request(make_request, 4)
    with pytest.raises(InsufficientCapacity) as caught:
        services.approve(request, actor=operator)
    assert caught.value.message == (
        "need 4 x H100-80GB full GPU on one node, at most 3 free on one node on c1;"
        " b would hold it once 1 of its 4 GPUs are released"
    )
    assert caught.value.detail["one_node"] == {"node": "b", "gpus": 4, "free": 3, "to_release": 1}
    assert not Allocation.objects.filter(pool__request=request).exists()


def test_no_node_large_enough(fleet, make_request, operator):
    fleet.full_node("a", gpus=2)
    fleet.full_node("b", gpus=2)
    with pytest.raises(InsufficientCapacity) as caught:
        services.approve(full_request(make_request, 4), actor=operator)
    assert caught.value.detail["one_node"] == {"node": None, "largest": 2}
    assert "no node has 4 such GPUs (the largest has 2)" in caught.value.message


def test_single_gpu_requests_still_pack_by_node_order(fleet, make_request, operator):
    fleet.full_node("a", gpus=1)
    fleet.full_node("b", gpus=1)
    pool = services.approve(full_request(make_request, 1), actor=operator)
    assert pool.placement == ""


# --- NVLink: a set within one NVLink group is preferred -------------------------------------------------


def _nvlink(node, groups):
    """Give the node's GPUs NVLink groups by index (None: no NVLink peer), as discovery records them."""
    for gpu in node.gpus.order_by("index"):
        gpu.nvlink_group = groups[gpu.index]
        gpu.save(update_fields=["nvlink_group"])


def test_group_set_takes_the_best_fitting_group():
    gpus = [(10, None), (11, 1), (12, 1), (13, 3), (14, 3), (15, 3), (16, 3)]
    assert topology.group_set(gpus, 2) == [11, 12]  # the pair leaves nothing over
    assert topology.group_set(gpus, 3) == [13, 14, 15]
    assert topology.group_set(gpus, 5) == []


def test_local_set_falls_back_from_nvlink_to_one_host_bridge_to_one_numa_node():
    # (id, NVLink group, PCIe host-bridge group, NUMA group): bridged pairs, pairs under a switch, 2 sockets
    gpus = [(11, None, 0, 0), (12, 2, 2, 0), (13, 2, 2, 0), (14, 4, 4, 4), (15, 4, 4, 4), (16, 6, 6, 4), (17, 6, 6, 4)]
    assert topology.local_set(gpus, 2) == (0, [12, 13])
    assert topology.local_set(gpus, 3) == (2, [11, 12, 13])  # socket 0 holds 3 exactly
    assert topology.local_set(gpus, 4) == (2, [14, 15, 16, 17])
    assert topology.local_set(gpus, 5) == (topology.NOWHERE, [])
    no_nvlink = [(gpu_id, None, pcie, numa) for gpu_id, _, pcie, numa in gpus]
    assert topology.local_set(no_nvlink, 2) == (1, [12, 13])


def test_four_gpus_get_an_nvlink_set_on_a_node_where_only_some_are_connected(fleet, make_request, operator):
    node = fleet.full_node("hgx", gpus=8)
    _nvlink(node, [None, None, None, 3, 3, 3, 3, 3])  # GPUs 0-2 lost their NVLinks
    pool = services.approve(full_request(make_request, 4), actor=operator)
    taken = sorted(Allocation.objects.filter(pool=pool).values_list("gpu__index", flat=True))
    assert taken == [3, 4, 5, 6]  # not 0-3, which index order alone would take
    assert pool.placement == "4 whole GPUs on one node (hgx), NVLink-connected"
    second = services.approve(full_request(make_request, 4), actor=operator)  # no NVLink set of 4 is left
    assert sorted(Allocation.objects.filter(pool=second).values_list("gpu__index", flat=True)) == [0, 1, 2, 7]
    assert second.placement == "4 whole GPUs on one node (hgx), not all NVLink-connected"


def test_a_node_with_an_nvlink_set_comes_before_a_better_fit_without_one(fleet, make_request, operator):
    pcie = fleet.full_node("a-pcie", gpus=4)
    _nvlink(pcie, [0, 0, 2, 2])  # bridged pairs: no NVLink set of 4
    hgx = fleet.full_node("b-hgx", gpus=8)
    _nvlink(hgx, [0] * 8)  # NVSwitch: all 8 joined
    pool = services.approve(full_request(make_request, 4), actor=operator)
    assert set(Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True)) == {"b-hgx"}
    pair = services.approve(full_request(make_request, 2), actor=operator)  # a bridged pair fits exactly
    assert sorted(Allocation.objects.filter(pool=pair).values_list("gpu__node__name", "gpu__index")) in (
        [("a-pcie", 0), ("a-pcie", 1)],
        [("a-pcie", 2), ("a-pcie", 3)],
    )
    assert pair.placement.endswith(", NVLink-connected")


def test_discovery_reads_nvlink_groups_from_nvml_and_training_gets_an_nvlink_set(sim, make_request, operator):
    """The simulator's fake NVML answers nvmlDeviceGetNvLinkState / nvmlDeviceGetNvLinkRemotePciInfo_v2 like an
    HGX H100 board (8 GPUs, every link ending on one of 4 NVSwitches); GPUs whose NVLinks are down drop out
    of the NVLink group."""
    cluster = sim.state.cluster("prod")
    with sim.state.lock:
        for gpu in cluster.nodes["prod-h100-full-01"].gpus[:3]:
            gpu.nvlink_down = True
    assert discover_cluster(sim.clusters["prod"].pk, inventory="inline").run.status == "succeeded"
    groups = lambda name: list(  # noqa: E731
        GpuCapacity.objects.filter(node__name=name).order_by("index").values_list("nvlink_group", flat=True)
    )
    assert groups("prod-h100-full-02") == [0] * 8
    assert groups("prod-h100-full-01") == [None, None, None, 3, 3, 3, 3, 3]

    pool = services.approve(full_request(make_request, 4), actor=operator)
    gpus = set(Allocation.objects.filter(pool=pool).values_list("gpu__node__name", "gpu__nvlink_group"))
    assert len({node for node, _ in gpus}) == 1 and None not in {group for _, group in gpus}
    assert pool.placement.endswith(", NVLink-connected")


def test_four_gpus_on_a_pcie_pair_node_come_from_one_numa_node(db, tmp_path, make_request, operator):
    """8 x H100 NVL: NVLink bridges join pairs only, so no NVLink set of 4 exists; discovery reads the PCIe
    common ancestor and the 4 GPUs come from one socket (4-7), not the first four free by index (1-4)."""
    group = {"name_prefix": "nvl", "product": "H100-94GB-NVL", "gpus_per_node": 8, "tier": "full"}
    state = Scenario.from_dict({"name": "t", "clusters": [{"name": "c1", "node_groups": [group]}]}).build()
    with SimServer(state) as server:
        cluster, _ = register_cluster("c1", server.write_kubeconfigs(tmp_path)["c1"])
        assert discover_cluster(cluster.pk, inventory="inline").run.status == "succeeded"
    rows = GpuCapacity.objects.filter(node__name="nvl-01").order_by("index")
    assert list(rows.values_list("nvlink_group", "pcie_group", "numa_group")) == [
        (0, 0, 0),
        (0, 0, 0),
        (2, 2, 0),
        (2, 2, 0),
        (4, 4, 4),
        (4, 4, 4),
        (6, 6, 4),
        (6, 6, 4),
    ]
    nvl = lambda count: make_request(  # noqa: E731
        isolation="full", product="H100-94GB-NVL", profile_name="", count=count, workload_type="training"
    )
    first = services.approve(nvl(1), actor=operator)
    assert list(Allocation.objects.filter(pool=first).values_list("gpu__index", flat=True)) == [0]
    pool = services.approve(nvl(4), actor=operator)
    assert sorted(Allocation.objects.filter(pool=pool).values_list("gpu__index", flat=True)) == [4, 5, 6, 7]
    assert pool.placement == "4 whole GPUs on one node (nvl-01), not all NVLink-connected, on one NUMA node"
    pair = services.approve(nvl(2), actor=operator)  # GPUs 1, 2, 3 are left: the bridged pair 2-3
    assert sorted(Allocation.objects.filter(pool=pair).values_list("gpu__index", flat=True)) == [2, 3]
    assert pair.placement == "2 whole GPUs on one node (nvl-01), NVLink-connected"
