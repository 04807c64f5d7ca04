"""Take-offline: would the remaining capacity cover every allocation if these GPUs or nodes went down?"""

import pytest
from reconfig_sim import allocate, gpu_row, node_row, start_sim

from operations.maintenance import take_offline_check

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(
        tmp_path,
        [
            ("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"], 1: ["3g.40gb", "3g.40gb"]}, ""),
            ("gpu-b", "H100-80GB", 1, {0: ["3g.40gb", "3g.40gb"]}, ""),
            ("gpu-c", "H100-80GB", 1, None, ""),
        ],
    )
    yield sim
    sim.server.stop()


def test_a_node_going_down_with_more_allocations_than_free_units_elsewhere(sim):
    a0, a1 = gpu_row("gpu-a", 0), gpu_row("gpu-a", 1)
    held = [allocate(a0, mig_start=0), allocate(a0, mig_start=4), allocate(a1, mig_start=0)]

    check = take_offline_check(nodes=[node_row("gpu-a")])

    assert check.covered is False
    assert [(h.allocation.pk, h.unit, h.movable) for h in check.hit] == [
        (held[0].pk, "H100-80GB 3g.40gb", True),
        (held[1].pk, "H100-80GB 3g.40gb", True),
        (held[2].pk, "H100-80GB 3g.40gb", False),
    ]
    assert check.free_elsewhere == {"H100-80GB 3g.40gb": 2, "H100-80GB full GPU": 1}
    assert check.shortfall == {"H100-80GB 3g.40gb": 1}
    assert [(g.node.name, g.index) for g in check.gpus] == [("gpu-a", 0), ("gpu-a", 1)]


def test_one_gpu_going_down_is_covered_by_free_units_on_the_same_node_and_elsewhere(sim):
    a0, a1 = gpu_row("gpu-a", 0), gpu_row("gpu-a", 1)
    allocate(a0, mig_start=0)
    allocate(a0, mig_start=4)
    allocate(a1, mig_start=0)

    check = take_offline_check(gpus=[a0])

    assert check.covered is True
    assert check.free_elsewhere == {"H100-80GB 3g.40gb": 3, "H100-80GB full GPU": 1}
    assert check.shortfall == {}
    assert check.to_dict()["hit"][0] == {
        "allocation": check.hit[0].allocation.pk,
        "project": "team-a",
        "pool": check.hit[0].allocation.pool_id,
        "node": "gpu-a",
        "gpu": 0,
        "unit": "H100-80GB 3g.40gb",
        "movable": True,
    }


def test_a_full_gpu_needs_a_free_full_gpu_and_cordoned_nodes_do_not_count(sim):
    allocate(gpu_row("gpu-c", 0), kind="full")
    check = take_offline_check(nodes=[node_row("gpu-c")])
    assert [(h.unit, h.movable) for h in check.hit] == [("H100-80GB full GPU", False)]
    assert check.covered is False

    b = node_row("gpu-b")
    b.cordoned = True
    b.save()
    allocate(gpu_row("gpu-a", 0), mig_start=0)
    check = take_offline_check(gpus=[gpu_row("gpu-a", 0)])
    assert check.free_elsewhere == {"H100-80GB 3g.40gb": 2}  # gpu-a GPU 1 only; gpu-b is cordoned
    assert check.covered is True


def test_nothing_allocated_is_trivially_covered(sim):
    check = take_offline_check(nodes=[node_row("gpu-b")])
    assert (check.covered, check.hit, check.shortfall) == (True, [], {})
