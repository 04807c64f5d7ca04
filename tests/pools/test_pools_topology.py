"""Whole GPUs for multi-GPU work sit on one node: never split while one node can hold the request."""

import pytest

from pools import services
from pools.exceptions import InsufficientCapacity
from pools.models import Allocation

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
