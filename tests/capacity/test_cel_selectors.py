"""The CEL selectors gpuaas writes into its ResourceClaimTemplates, checked with the CEL library before they are
written (capacity/adapters/cel.py, pools/provisioning.uuid_selector)."""

from __future__ import annotations

import pytest

from capacity.adapters.cel import SelectorError, admits, checked_device_selector
from pools.provisioning import DRA_DRIVER, uuid_selector

GPU = "GPU-4f6c2b1e-0b9e-4a4c-9d2e-6f1a2b3c4d5e"
MIG = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d"


def test_a_pools_selector_admits_exactly_its_units():
    expression = uuid_selector([MIG, GPU])
    assert expression == f'device.attributes["gpu.nvidia.com"].uuid in ["{GPU}", "{MIG}"]'
    assert admits(expression, DRA_DRIVER, GPU) and admits(expression, DRA_DRIVER, MIG)
    for other in (GPU[:-1], GPU + "0", "GPU-00000000-0000-0000-0000-000000000000", ""):
        assert not admits(expression, DRA_DRIVER, other)
    assert not admits(expression, "other.example.com", GPU)  # another driver's device has no such attribute


def test_a_uuid_with_quotes_is_escaped_and_still_matched_exactly():
    odd = 'GPU-"]||true||["'
    expression = uuid_selector([odd])
    assert admits(expression, DRA_DRIVER, odd)
    assert not admits(expression, DRA_DRIVER, GPU)


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ('device.attributes["gpu.nvidia.com"].uuid in ', "does not compile"),
        ("request.userInfo.username == 'x'", "references request"),
        ('device.attributes["gpu.nvidia.com"].uuid.startsWith("GPU")', "also admits GPU-00"),
        (f'device.attributes["gpu.nvidia.com"].uuid == "{MIG}"', f"does not admit {GPU}"),
    ],
)
def test_a_selector_that_is_not_exact_is_never_written(expression, why):
    with pytest.raises(SelectorError, match=why.replace("(", r"\(")):
        checked_device_selector(
            expression, driver=DRA_DRIVER, admitted=[GPU], refused=["GPU-00000000-0000-0000-0000-000000000000"]
        )
