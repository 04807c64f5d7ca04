"""`manage.py mig validate|plan` and `manage.py capacity-plan` (no database involved)."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_validate_json_valid():
    data = json.loads(run("mig", "validate", "--product", "H100-80GB", "--layout", "4g.40gb,3g.40gb", "--json"))
    assert data == {
        "valid": True,
        "reason": "",
        "placements": [
            {"profile": "4g.40gb", "start": 0, "size": 4},
            {"profile": "3g.40gb", "start": 4, "size": 4},
        ],
    }


def test_validate_json_invalid_is_an_answer_not_an_error():
    data = json.loads(run("mig", "validate", "--product", "H100-80GB", "--layout", "3g.40gb=2,1g.10gb", "--json"))
    assert data == {"valid": False, "reason": "memory slices exhausted (needs 9 of 8)", "placements": []}


def test_validate_without_json_prints_a_table_or_fails():
    out = run("mig", "validate", "--product", "NVIDIA-H100-80GB-HBM3", "--layout", "2g.20gb=3,1g.10gb")
    assert "H100-80GB: valid layout" in out
    assert "1g.10gb          6    1  ......#." in out
    with pytest.raises(CommandError, match=r"compute slices exhausted \(needs 8 of 7\)"):
        run("mig", "validate", "--product", "H100-80GB", "--layout", "7g.80gb,1g.10gb")


def test_unknown_product_names_the_known_ones():
    with pytest.raises(CommandError, match="unknown GPU product 'B300'; known: A100-40GB, .*H200-141GB"):
        run("mig", "validate", "--product", "B300", "--layout", "1g.10gb", "--json")


def test_bad_layout_syntax_is_an_error():
    with pytest.raises(CommandError, match="bad layout entry '3g'"):
        run("mig", "validate", "--product", "H100-80GB", "--layout", "3g", "--json")


def test_plan_json():
    data = json.loads(run("mig", "plan", "--product", "H100-80GB", "--demand", "3g.40gb=5,1g.10gb=9", "--json"))
    assert data["product"] == "H100-80GB" and data["gpus"] == 4 and data["optimal"] is True
    profiles = [p["profile"] for layout in data["layouts"] for p in layout]
    assert profiles.count("3g.40gb") == 5 and profiles.count("1g.10gb") == 9
    assert set(data["layouts"][0][0]) == {"profile", "start", "size"}


def test_plan_table_groups_identical_gpus():
    out = run("mig", "plan", "--product", "H100-80GB", "--demand", "4g.40gb=3,3g.40gb=3")
    assert out.splitlines() == ["H100-80GB: 3 GPUs (optimal)", "      3 x  4g.40gb@0 3g.40gb@4"]


def test_plan_bad_demand():
    with pytest.raises(CommandError, match="no MIG profile '3g.20gb'"):
        run("mig", "plan", "--product", "H100-80GB", "--demand", "3g.20gb=2")


def test_capacity_plan_seed_arithmetic():
    data = json.loads(
        run(
            "capacity-plan",
            "--product",
            "H100-80GB",
            "--gpus",
            "8",
            "--layout",
            "4g.40gb,3g.40gb",
            "--timeslice-replicas",
            "4",
            "--json",
        )
    )
    assert data["tiers"]["1"] == {"slots": 16, "by_spec": {"4g.40gb": 8, "3g.40gb": 8}}
    assert data["tiers"]["3"]["slots"] == 32


def test_capacity_plan_table_and_full_gpus():
    out = run("capacity-plan", "--product", "H100-80GB", "--gpus", "8")
    assert out.splitlines() == ["8 x H100-80GB", "  Full GPUs, training: 8 slots (H100-80GB x 8)"]


def test_capacity_plan_invalid_layout_names_the_reason():
    with pytest.raises(CommandError, match=r"too many instances of 3g.40gb: 3 \(max 2\)"):
        run("capacity-plan", "--product", "H100-80GB", "--gpus", "8", "--layout", "3g.40gb=3")
