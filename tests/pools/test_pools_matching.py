"""Matching a declaration to an offer (pools/units/matching.py): the table of declarations, expected offers and reasons.

A pure function: the fleet is described here (H100 MIG, whole H100 and H200 nodes of 8, H100 and
H200 time-sliced 4 ways) and prices are the default rate derivation of billing/rates.py.
"""

from decimal import Decimal
from fractions import Fraction

import pytest

from capacity.mig.catalog import PRODUCTS
from capacity.tiers import DEFAULT_POLICIES, Policy
from pools.units.candidates import full_candidate, mig_candidates, timeslice_candidate
from pools.units.matching import Need, match
from pricing import rates

FULL_PRICES = {"H100-80GB": Decimal("2.50"), "H200-141GB": Decimal("3.20")}
FLEET = [
    *mig_candidates(PRODUCTS["H100-80GB"]),
    full_candidate("H100-80GB", Fraction(80), 8),
    full_candidate("H200-141GB", Fraction(141), 8),
    timeslice_candidate("H100-80GB", Fraction(80), 4),
    timeslice_candidate("H200-141GB", Fraction(141), 4),
]
TS_H100, TS_H200 = "time-slicing (H100-80GB, 1/4)", "time-slicing (H200-141GB, 1/4)"


def price(kind, product, profile_name, replicas):
    return rates.derive_price(FULL_PRICES[product], rates.spec_key(kind, product, profile_name, replicas))


CASES = [
    # (id, declaration, expected offer or None, {rejected offer: words its reason contains})
    ("dev-8-gib-is-time-sliced", Need("development", memory_gib=8), TS_H100, {}),
    (
        "training-60-gib-is-a-full-gpu",
        Need("training", memory_gib=60),
        "full GPU (H100-80GB)",
        {TS_H100: "20 GiB (80 GiB / 4), you asked for 60 GiB", "MIG 4g.40gb (H100-80GB)": "offers 40 GiB"},
    ),
    (
        "200-gib-time-sliced-h200-refused",
        Need("development", memory_gib=200, product="H200-141GB"),
        None,
        {TS_H200: "35.2 GiB (141 GiB / 4), you asked for 200 GiB", "full GPU (H200-141GB)": "one GPU has 141 GiB"},
    ),
    ("dev-200-gib-nothing", Need("development", memory_gib=200), None, {TS_H100: "you asked for 200 GiB"}),
    (
        "inference-small-goes-to-tier-1-policy",
        Need("inference", memory_gib=8),
        "MIG 3g.40gb (H100-80GB)",
        {
            "MIG 1g.10gb (H100-80GB)": "Withheld by tier policy (tier 1 takes 3g and larger)",
            TS_H100: "no memory isolation, you asked for isolation=hardware",
        },
    ),
    ("inference-30", Need("inference", memory_gib=30), "MIG 3g.40gb (H100-80GB)", {}),
    ("inference-50", Need("inference", memory_gib=50), "MIG 7g.80gb (H100-80GB)", {}),
    (
        "inference-90-whole-h200",
        Need("inference", memory_gib=90),
        "full GPU (H200-141GB)",
        {"full GPU (H100-80GB)": "one GPU has 80 GiB", "MIG 7g.80gb (H100-80GB)": "offers 80 GiB"},
    ),
    (
        "dev-hardware-isolation-gets-mig",
        Need("development", memory_gib=8, isolation="hardware"),
        "MIG 1g.10gb (H100-80GB)",
        {TS_H100: "time-slicing (H100-80GB, 1/4): no memory isolation, you asked for isolation=hardware"},
    ),
    ("dev-hardware-15", Need("development", memory_gib=15, isolation="hardware"), "MIG 1g.20gb (H100-80GB)", {}),
    (
        "dev-half-a-gpu-of-compute",
        Need("development", compute_fraction=Decimal("0.5")),
        "MIG 4g.40gb (H100-80GB)",
        {
            TS_H100: "a replica gets 1/4 of the GPU's compute on average, with no guarantee; you asked for 0.5",
            "MIG 3g.40gb (H100-80GB)": "gives 3/7 of a GPU's compute",
        },
    ),
    ("dev-quarter-compute", Need("development", compute_fraction=Decimal("0.25")), TS_H100, {}),
    ("inference-short-no-isolation-shares", Need("inference", memory_gib=8, isolation="none", hours=2), TS_H100, {}),
    (
        "inference-open-ended-no-isolation-not-shared",
        Need("inference", memory_gib=8, isolation="none"),
        "MIG 3g.40gb (H100-80GB)",
        {TS_H100: "no performance guarantee for a long-running inference service (open-ended)"},
    ),
    (
        "inference-long-no-isolation-not-shared",
        Need("inference", memory_gib=8, isolation="none", hours=72),
        "MIG 3g.40gb (H100-80GB)",
        {TS_H100: "(72 h); shared tiers suit short interactive sessions"},
    ),
    (
        "four-gpu-training-one-node",
        Need("training", memory_gib=60, count=4),
        "4 x full GPU (H100-80GB) on one node",
        {
            "MIG 7g.80gb (H100-80GB)": "multi-unit training needs whole GPUs",
        },
    ),
    (
        "ten-gpu-training-no-node-holds-it",
        Need("training", count=10),
        None,
        {"10 x full GPU (H100-80GB) on one node": "needs 10 GPUs on one node, the largest H100-80GB node has 8"},
    ),
    ("training-200-gib-two-h200", Need("training", memory_gib=200), "2 x full GPU (H200-141GB) on one node", {}),
    ("training-short-experiment-shares", Need("training", memory_gib=8, hours=2), TS_H100, {}),
    (
        "training-48h-whole-gpu",
        Need("training", memory_gib=8, hours=48),
        "full GPU (H100-80GB)",
        {TS_H100: "a training run (48 h) would starve the GPU's other tenants"},
    ),
    (
        "staging-needs-own-memory",
        Need("staging", memory_gib=20),
        "MIG 1g.20gb (H100-80GB)",
        {TS_H100: "no memory isolation, you asked for isolation=memory"},
    ),
    ("staging-40", Need("staging", memory_gib=40), "MIG 3g.40gb (H100-80GB)", {}),
    ("inference-h200-only-whole", Need("inference", memory_gib=8, product="H200-141GB"), "full GPU (H200-141GB)", {}),
    ("inference-three-units", Need("inference", memory_gib=30, count=3), "MIG 3g.40gb (H100-80GB)", {}),
    (
        "dev-30-h200-share",
        Need("development", memory_gib=30),
        TS_H200,
        {TS_H100: "a replica's share of the GPU's memory is 20 GiB"},
    ),
    ("dev-40-falls-to-mig", Need("development", memory_gib=40), "MIG 3g.40gb (H100-80GB)", {TS_H200: "35.2 GiB"}),
    ("dev-whole-compute", Need("development", compute_fraction=Decimal("1")), "MIG 7g.80gb (H100-80GB)", {}),
    ("inference-0.9-compute", Need("inference", compute_fraction=Decimal("0.9")), "MIG 7g.80gb (H100-80GB)", {}),
    (
        "inference-100-on-h100-refused",
        Need("inference", memory_gib=100, product="H100-80GB"),
        None,
        {"full GPU (H100-80GB)": "one GPU has 80 GiB, you asked for 100 GiB"},
    ),
    ("dev-a-month-still-shared", Need("development", memory_gib=8, hours=720), TS_H100, {}),
    ("staging-short-no-isolation-shares", Need("staging", memory_gib=10, isolation="none", hours=4), TS_H100, {}),
    (
        "training-hardware-2x100",
        Need("training", memory_gib=100, count=2, isolation="hardware"),
        "2 x full GPU (H200-141GB) on one node",
        {TS_H200: "no memory isolation"},
    ),
    (
        "inference-hbm-compute-0.3-tier1",
        Need("inference", memory_gib=20, compute_fraction=Decimal("0.3")),
        "MIG 3g.40gb (H100-80GB)",
        {"MIG 2g.20gb (H100-80GB)": "Withheld by tier policy (tier 1 takes 3g and larger)"},
    ),
]


@pytest.mark.parametrize(("declared", "expected", "reasons"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_declaration_matches_expected_offer(declared, expected, reasons):
    result = match(declared, FLEET, price=price)
    chosen = result.chosen.label if result.chosen else None
    assert chosen == expected, result.why()
    explained = {o.label: o.explanation() for o in result.rejected}
    for label, words in reasons.items():
        assert words in explained[label], explained.get(label)
    assert all(o.reasons for o in result.rejected)
    assert all(not o.reasons for o in result.offers)


def test_at_least_thirty_declarations():
    assert len(CASES) >= 30


def test_ranked_offers_carry_prices_and_why():
    result = match(Need("development", memory_gib=8), FLEET, price=price)
    first = result.offers[0].to_dict()
    assert (first["kind"], first["tier"], first["hourly_price"], first["memory_gib_per_unit"]) == (
        "timeslice",
        "3",
        "0.625000",
        20.0,
    )
    assert [o.tier for o in result.offers][:2] == ["3", "3"]
    assert "MIG 1g.10gb (H100-80GB): ranked lower (tier 2 comes after tier 3 for this workload)" in result.why()


def test_operator_policy_lets_tier_1_take_small_profiles():
    table = {**DEFAULT_POLICIES, "1": Policy(min_compute_slices=1)}
    result = match(Need("inference", memory_gib=8), FLEET, price=price, policy_table=table)
    assert result.chosen.label == "MIG 1g.10gb (H100-80GB)"


def test_without_prices_ranks_by_gpu_share():
    result = match(Need("inference", memory_gib=8), FLEET, price=lambda *a: None)
    assert result.chosen.label == "MIG 3g.40gb (H100-80GB)"
    assert result.chosen.to_dict()["hourly_price"] is None


MPS_FLEET = [*FLEET, timeslice_candidate("H100-80GB", Fraction(80), 4, mps=True)]


@pytest.mark.parametrize(
    ("declared", "expected", "reasons"),
    [
        (Need("development", memory_gib=8), "MPS (H100-80GB, 1/4)", {}),
        (
            Need("development", memory_gib=30),
            TS_H200,
            {"MPS (H100-80GB, 1/4)": "each client is capped at 20 GiB, you asked for 30 GiB"},
        ),
        (
            Need("development", compute_fraction=Decimal("0.5")),
            "MIG 4g.40gb (H100-80GB)",
            {"MPS (H100-80GB, 1/4)": "each client is capped at 25% of the SMs; you asked for 0.5"},
        ),
        (Need("training", memory_gib=8, hours=48), "full GPU (H100-80GB)", {}),
    ],
    ids=["mps-before-plain-time-slicing", "mps-memory-cap", "mps-compute-cap", "training-still-whole"],
)
def test_mps_is_the_tier_3_option_with_limits(declared, expected, reasons):
    result = match(declared, MPS_FLEET, price=price)
    assert (result.chosen.label if result.chosen else None) == expected, result.why()
    explained = {o.label: o.explanation() for o in result.rejected}
    for label, words in reasons.items():
        assert words in explained[label]
    if expected.startswith("MPS"):
        assert result.chosen.spec() == {
            "spec_kind": "mps",  # its own unit kind, priced as an MPS share
            "isolation": "mps",
            "tier": "3",
            "product": "H100-80GB",
            "profile_name": "",
            "count": 1,
        }
        assert "capped at 20 GiB and 25% of the SMs" in result.chosen.note
