"""`bench approvals` builds a world the tier profile policy admits, and approves exactly its units
(benchmarks/pools.py). Issue #27: a policy that refused its 1g units on tier 1 made it approve 0 of 200."""

import io
from unittest import mock

import pytest
from django.contrib.auth import get_user_model

from benchmarks.pools import approval_spec, approvals_benchmark, build_approval_world, double_allocated
from capacity import tiers
from capacity.choices import Tier
from capacity.models import MigInstance, TierProfilePolicy
from pools import services
from pools.exceptions import InsufficientCapacity
from pools.models import GpuPool, PoolRequest

pytestmark = pytest.mark.django_db


def test_the_default_policy_gives_the_densest_profile_on_a_tier_that_admits_it():
    tier, profile = approval_spec()
    assert (tier, profile.name) == (Tier.STAGING, "1g.10gb")  # tier 1 takes 3g and larger (its seeded row)
    assert tiers.profile_allowed(tier, "H100-80GB", profile.name, tiers.policies())


def test_a_stricter_policy_moves_the_world_to_what_it_admits():
    TierProfilePolicy.objects.update(min_compute_slices=3, max_compute_slices=8)  # every tier's row
    tier, profile = approval_spec()
    assert (tier, profile.name) == (Tier.SLA_INFERENCE, "3g.40gb")


def _approve_all(ids: list[int]) -> list[str]:
    operator = get_user_model().objects.create_superuser("op", "", "x")
    outcomes = []
    with mock.patch.object(services, "enqueue_provisioning"):
        for pk in ids:
            try:
                services.approve(PoolRequest.objects.get(pk=pk), actor=operator)
                outcomes.append("approved")
            except InsufficientCapacity:
                outcomes.append("short")
    return outcomes


@pytest.mark.parametrize("strict", [False, True], ids=["default policy", "3g and larger everywhere"])
def test_the_world_approves_exactly_its_units_under_the_policy_of_the_day(strict):
    if strict:
        TierProfilePolicy.objects.update(min_compute_slices=3, max_compute_slices=8)  # every tier's row
    ids, tier, profile = build_approval_world(requests=7, units=5)
    assert MigInstance.objects.filter(profile=profile, gpu__node__tier=tier).count() == 5
    assert _approve_all(ids) == ["approved"] * 5 + ["short"] * 2
    assert GpuPool.objects.count() == 5 and double_allocated() == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_benchmark_under_concurrency_approves_exactly_the_units_once():
    """The benchmark itself, in its own throwaway database: two threads, eight requests, four units."""
    result = approvals_benchmark(stdout=io.StringIO(), requests=8, units=4, workers=2, keep_db=False)
    assert {k: result[k] for k in ("approved", "short_of_capacity", "collisions", "double_allocated")} == {
        "approved": 4,
        "short_of_capacity": 4,
        "collisions": 0,
        "double_allocated": 0,
    }
