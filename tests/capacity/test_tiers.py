"""The seed's tier arithmetic (Swedish seed: 16 tier-1 slots, 32 tier-3 slots from 8 x H100)."""

import json

import pytest

from capacity.mig.tiers import capacity_plan


def test_eight_h100_split_4g_3g_give_16_mig_slots():
    plan = capacity_plan("H100-80GB", 8, layout="4g.40gb,3g.40gb")
    assert plan == {
        "product": "H100-80GB",
        "gpus": 8,
        "tiers": {"1": {"slots": 16, "by_spec": {"4g.40gb": 8, "3g.40gb": 8}}},
        "layout": [
            {"profile": "4g.40gb", "start": 0, "size": 4},
            {"profile": "3g.40gb", "start": 4, "size": 4},
        ],
    }


def test_same_eight_time_sliced_four_ways_give_32_slots():
    plan = capacity_plan("H100-80GB", 8, timeslice_replicas=4)
    assert plan["tiers"] == {"3": {"slots": 32, "replicas": 4, "by_spec": {"H100-80GB": 32}}}
    assert plan["layout"] == []


def test_both_uses_of_the_same_gpus_side_by_side():
    plan = capacity_plan("H100-80GB", 8, layout=["4g.40gb", "3g.40gb"], timeslice_replicas=4)
    assert {tier: t["slots"] for tier, t in plan["tiers"].items()} == {"1": 16, "3": 32}
    json.dumps(plan)


def test_whole_gpus_are_the_training_tier():
    plan = capacity_plan("NVIDIA-H100-80GB-HBM3", 8)
    assert plan["tiers"] == {"full": {"slots": 8, "by_spec": {"H100-80GB": 8}}}


def test_layout_with_repeats_counts_every_instance():
    plan = capacity_plan("A30-24GB", 3, layout="2g.12gb,1g.6gb=2")
    assert plan["tiers"]["1"] == {"slots": 9, "by_spec": {"2g.12gb": 3, "1g.6gb": 6}}


def test_invalid_layout_raises_with_the_reason():
    with pytest.raises(ValueError, match=r"memory slices exhausted \(needs 9 of 8\)"):
        capacity_plan("H100-80GB", 8, layout="3g.40gb=2,1g.10gb")
    with pytest.raises(ValueError, match="no MIG profile '4g.20gb'"):
        capacity_plan("H100-80GB", 8, layout="4g.20gb")
    with pytest.raises(ValueError, match="bad layout entry"):
        capacity_plan("H100-80GB", 8, layout="4g")


@pytest.mark.parametrize("kwargs", [{"gpus": -1}, {"gpus": 8, "timeslice_replicas": 1}, {"gpus": 2.5}])
def test_bad_numbers_are_refused(kwargs):
    with pytest.raises(ValueError):
        capacity_plan("H100-80GB", **kwargs)
