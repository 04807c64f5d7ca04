"""Declared needs map to the smallest fitting MIG profile and to a tier; bad declarations name their field."""

import pytest

from pools import services
from pools.exceptions import SpecError
from pools.units.specs import resolve

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("memory_gib", "compute", "expected"),
    [
        (10, None, "1g.10gb"),
        (11, None, "1g.20gb"),
        (20, None, "1g.20gb"),
        (30, None, "3g.40gb"),
        (40, None, "3g.40gb"),
        (10, "0.5", "4g.40gb"),
        (41, None, "7g.80gb"),
        (None, "0.3", "3g.40gb"),
    ],
)
def test_smallest_fitting_profile_on_a_product(memory_gib, compute, expected):
    spec = resolve(product="H100-80GB", memory_gib=memory_gib, compute_fraction=compute)
    assert (spec.product, spec.profile_name, spec.spec_kind, spec.tier) == ("H100-80GB", expected, "mig", "1")


def test_without_a_product_the_fleets_products_are_searched():
    spec = resolve(memory_gib=60, fleet_mig_products=["H100-80GB", "H200-141GB"])
    assert (spec.product, spec.profile_name) == ("H200-141GB", "3g.71gb")


def test_tier_follows_isolation_and_workload():
    assert resolve(isolation="timeslice").tier == "3"
    assert resolve(isolation="full").tier == "full"
    assert resolve(profile_name="1g.10gb", product="H100-80GB", workload_type="staging").tier == "2"
    assert resolve(tier="3").isolation == "timeslice"
    assert resolve(tier="full").spec_kind == "full"


def test_aliases_and_resource_forms_are_normalised():
    spec = resolve(product="NVIDIA H100 80GB HBM3", profile_name="1g.10gb.me")
    assert (spec.product, spec.profile_name) == ("H100-80GB", "1g.10gb+me")


@pytest.mark.parametrize(
    ("declared", "errors"),
    [
        ({"product": "H100-80GB", "profile_name": "5g.50gb"}, {"profile_name"}),
        ({"product": "Z9000", "profile_name": "3g.40gb"}, {"product"}),
        ({"profile_name": "9g.99gb"}, {"profile_name"}),
        ({"product": "H100-80GB"}, {"profile_name"}),
        ({"product": "H100-80GB", "memory_gib": 500}, {"memory_gib"}),
        ({"product": "H100-80GB", "memory_gib": 0}, {"memory_gib", "profile_name"}),
        ({"product": "H100-80GB", "profile_name": "1g.10gb", "compute_fraction": "1.5"}, {"compute_fraction"}),
        ({"isolation": "full", "profile_name": "3g.40gb"}, {"profile_name"}),
        ({"isolation": "full", "product": "Z9000"}, {"product"}),
        ({"isolation": "mig", "tier": "3", "profile_name": "1g.10gb"}, {"tier"}),
    ],
)
def test_bad_declarations_name_their_fields(declared, errors):
    with pytest.raises(SpecError) as caught:
        resolve(**declared)
    assert set(caught.value.errors) == errors


def test_full_gpu_products_from_the_inventory_are_known(fleet):
    node = fleet.node("n1")
    fleet.gpu(node, 0)
    GpuCapacity = type(node.gpus.first())
    GpuCapacity.objects.filter(node=node).update(product="NVIDIA L40S", catalog_product="")
    assert services.resolve_spec(isolation="full", product="NVIDIA L40S").product == "NVIDIA L40S"
