"""The MIG catalog knows the boards a real fleet has (#14 item 7), under the names NVML and GFD report."""

import math

import pytest

from capacity.mig.catalog import PRODUCTS, find_product, get_product, mig_parted_entries
from capacity.models import MigPlacement, MigProfile
from capacity.services.catalog import load_catalog

# nvmlDeviceGetName (and GFD's nvidia.com/gpu.product, spaces -> "-") for each board, reference §1.4.
BOARDS = {
    "NVIDIA A100-PCIE-40GB": ("A100-40GB-PCIE", "NVIDIA-A100-PCIE-40GB", "1g.5gb", 0x20F1),
    "NVIDIA A100 80GB PCIe": ("A100-80GB-PCIE", "NVIDIA-A100-80GB-PCIe", "1g.10gb", 0x20B5),
    "NVIDIA H100 PCIe": ("H100-80GB-PCIE", "NVIDIA-H100-PCIe", "1g.10gb", 0x2331),
    "NVIDIA H100 NVL": ("H100-94GB-NVL", "NVIDIA-H100-NVL", "1g.12gb", 0x2321),
    "NVIDIA H200 NVL": ("H200-141GB-NVL", "NVIDIA-H200-NVL", "1g.18gb", 0x233B),
}


@pytest.mark.parametrize("name", BOARDS)
def test_boards_missing_before_are_known_by_nvml_name_and_gfd_label(name):
    key, label, smallest, pci = BOARDS[name]
    product = find_product(name)
    assert product is not None and product.key == key
    assert (product.gfd_product, product.pci_device_id, product.profiles[0].name) == (label, pci, smallest)
    assert get_product(label) is product and get_product(f"{label}-MIG-{smallest}") is product


def test_h100_nvl_profiles_are_the_real_capture():
    nvl = get_product("H100-94GB-NVL")
    assert [(p.name, p.profile_id, p.memory_mib, p.multiprocessors, p.max_instances) for p in nvl.profiles] == [
        ("1g.12gb", 19, 11008, 16, 7),
        ("1g.12gb+me", 20, 11008, 16, 1),
        ("1g.24gb", 15, 22144, 26, 4),
        ("2g.24gb", 14, 22144, 32, 3),
        ("3g.47gb", 9, 47488, 60, 2),
        ("4g.47gb", 5, 47488, 64, 1),
        ("7g.94gb", 0, 95360, 132, 1),
    ]
    assert (nvl.memory_mib, nvl.power_limit_w) == (95830, 400)


def test_every_profile_name_follows_the_go_nvlib_rule():
    """name GB = round(ceil(profile MiB / total * 8) / 8 * ceil(total GiB)) (reference §1.5)."""
    for product in PRODUCTS.values():
        for p in product.profiles:
            eighths = math.ceil(p.memory_mib / product.memory_mib * 8)
            gb = math.floor(eighths / 8 * math.ceil(product.memory_mib / 1024) + 0.5)
            assert p.name.split(".")[1].removesuffix("+me") == f"{gb}gb", (product.key, p.name)


def test_pcie_boards_share_the_sxm_configs_in_the_mig_parted_config():
    entries = mig_parted_entries()
    [a100] = entries["all-1g.5gb"]
    assert set(a100["device-filter"]) == {"0x20B010DE", "0x20F110DE"}
    assert {f for e in entries["all-1g.10gb"] for f in e["device-filter"]} >= {"0x233010DE", "0x233110DE", "0x20B510DE"}
    assert entries["all-1g.12gb"][0]["device-filter"] == ["0x232110DE"]


def test_h200_profile_sizes_are_the_recorded_ones():
    """1g.18gb/2g.35gb/7g.141gb from a real -lgip, 3g.71gb from Nsight on a real slice (docs/simcluster.md)."""
    h200 = get_product("H200-141GB")
    assert [(p.name, p.memory_mib, p.multiprocessors) for p in h200.profiles] == [
        ("1g.18gb", 16384, 16),
        ("1g.18gb+me", 16384, 16),
        ("1g.35gb", 33280, 26),
        ("2g.35gb", 33280, 32),
        ("3g.71gb", 71424, 60),
        ("4g.71gb", 71424, 64),
        ("7g.141gb", 143360, 132),
    ]
    nvl = get_product("H200-141GB-NVL")
    assert nvl.profiles == h200.profiles and (nvl.memory_mib, nvl.power_limit_w) == (143771, 600)


@pytest.mark.django_db
def test_a_corrected_catalog_value_reaches_an_existing_database():
    MigProfile.objects.filter(product="H200-141GB", name="3g.71gb").update(memory_mib=66560)  # the old inferred value
    assert load_catalog(MigProfile, MigPlacement) > 0
    assert MigProfile.objects.get(product="H200-141GB", name="3g.71gb").memory_mib == 71424
    assert load_catalog(MigProfile, MigPlacement) == 0
