"""MIG geometry of the simulated GPUs against the reference (§1.3, §1.6)."""

from __future__ import annotations

import pytest

from capacity.mig.catalog import PRODUCTS
from simcluster.hardware import Gpu, HardwareError, LoadModel, ci_starts, plan_layout, remaining_capacity

H100 = PRODUCTS["H100-80GB"]


def gpu(product=H100) -> Gpu:
    g = Gpu(
        index=0, product=product, uuid="GPU-test", serial="1", pci_bus_id="00000000:18:00.0", load=LoadModel.seeded("t")
    )
    g.mig_current = g.mig_pending = 1
    return g


@pytest.mark.parametrize(
    ("profile", "start", "gi_id"),
    [
        ("7g.80gb", 0, 0),
        ("1g.10gb", 0, 7),
        ("1g.10gb", 6, 13),
        ("2g.20gb", 4, 5),
        ("1g.20gb", 6, 6),
        ("3g.40gb", 4, 1),
        ("4g.40gb", 0, 1),
    ],
)
def test_gi_ids_follow_the_observed_pattern(profile, start, gi_id):
    assert gpu().create_gpu_instance(H100.profile(profile), start).id == gi_id


def test_second_four_slice_gi_gets_the_other_id():
    g = gpu()
    assert [g.create_gpu_instance(H100.profile("3g.40gb"), s).id for s in (0, 4)] == [1, 2]


def test_overlap_counts_and_mig_off_are_refused():
    g = gpu()
    g.create_gpu_instance(H100.profile("4g.40gb"), 0)
    with pytest.raises(HardwareError) as exc:
        g.create_gpu_instance(H100.profile("2g.20gb"), 2)
    assert exc.value.code == 23
    g.create_gpu_instance(H100.profile("3g.40gb"), 4)  # 3g at {4} + 4g at {0} is valid
    assert (
        remaining_capacity(H100, H100.profile("1g.10gb"), [(gi.profile, gi.start) for gi in g.instances.values()]) == 0
    )
    one_me = gpu()
    one_me.create_gpu_instance(H100.profile("1g.10gb+me"))
    with pytest.raises(HardwareError):
        one_me.create_gpu_instance(H100.profile("1g.10gb+me"))
    off = gpu()
    off.mig_current = 0
    with pytest.raises(HardwareError) as exc:
        off.create_gpu_instance(H100.profile("1g.10gb"))
    assert exc.value.code == 3


@pytest.mark.parametrize(
    ("name", "expected"),
    [("1g.10gb", 7), ("1g.10gb+me", 1), ("1g.20gb", 4), ("2g.20gb", 3), ("3g.40gb", 2), ("4g.40gb", 1), ("7g.80gb", 1)],
)
def test_remaining_capacity_on_an_empty_gpu(name, expected):
    assert gpu().remaining_capacity(H100.profile(name)) == expected


def test_a_1g_at_start_6_blocks_the_third_2g():
    g = gpu()
    g.create_gpu_instance(H100.profile("1g.10gb"), 6)
    assert g.remaining_capacity(H100.profile("2g.20gb")) == 3  # starts 0, 2, 4 are still free
    g.create_gpu_instance(H100.profile("1g.10gb"), 4)
    assert g.remaining_capacity(H100.profile("2g.20gb")) == 2


def test_plans():
    names = [p.name for p, _ in plan_layout(H100, [H100.profile("3g.40gb"), H100.profile("4g.40gb")])]
    assert sorted(names) == ["3g.40gb", "4g.40gb"]
    assert plan_layout(H100, [H100.profile("3g.40gb")] * 3) is None
    assert plan_layout(H100, [H100.profile("1g.10gb")] * 7 + [H100.profile("1g.10gb")]) is None
    plan = plan_layout(
        H100, [H100.profile("1g.10gb"), H100.profile("1g.10gb"), H100.profile("2g.20gb"), H100.profile("3g.40gb")]
    )
    assert sorted((p.name, s) for p, s in plan) == [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]


def test_ci_starts():
    assert ci_starts(7, 1) == (0, 1, 2, 3, 4, 5, 6)
    assert ci_starts(7, 2) == (0, 2, 4)
    assert ci_starts(7, 3) == (0, 4)
    assert ci_starts(4, 2) == (0, 2)
    assert ci_starts(4, 3) == ()
    assert ci_starts(3, 3) == (0,)
    assert ci_starts(2, 2) == (0,)


def test_a30_has_four_slices():
    a30 = PRODUCTS["A30-24GB"]
    g = gpu(a30)
    assert g.remaining_capacity(a30.profile("1g.6gb")) == 4
    assert g.create_gpu_instance(a30.profile("4g.24gb")).id == 0
