"""One GPU-share rule (capacity.mig.share): what billing charges and the dashboard weighs a unit by."""

from fractions import Fraction

from capacity.choices import SpecKind
from capacity.mig import share
from capacity.mig.share import mig_share, unit_share
from pricing import rates


def test_a_mig_profile_is_the_larger_of_its_compute_and_memory_share():
    assert mig_share("H100-80GB", "3g.40gb") == Fraction(1, 2)  # 3/7 compute, 4/8 memory
    assert mig_share("H100-80GB", "1g.10gb") == Fraction(1, 7)  # 1/7 compute, 1/8 memory
    assert mig_share("H100-80GB", "1g.20gb") == Fraction(1, 4)  # 1/7 compute, 2/8 memory
    assert mig_share("H100-80GB", "7g.80gb") == 1
    assert mig_share("A30-24GB", "2g.12gb") == Fraction(1, 2)  # 2/4 and 2/4
    assert mig_share("H100-80GB", "1g.10gb.me") == mig_share("H100-80GB", "1g.10gb+me")  # the resource form


def test_a_profile_the_catalog_does_not_know_falls_back_to_compute_slices():
    assert mig_share("H100-80GB", "5g.60gb", 5) == Fraction(5, 7)
    assert mig_share("", "3g.40gb", 3) == Fraction(3, 7)
    assert mig_share("", "", None) == 1


def test_a_unit_share_by_kind():
    assert unit_share(SpecKind.MIG, "H100-80GB", "3g.40gb") == Fraction(1, 2)
    assert unit_share(SpecKind.TIMESLICE, "H100-80GB", replicas=4) == Fraction(1, 4)
    assert unit_share(SpecKind.TIMESLICE, "H100-80GB", replicas=0) == 1
    assert unit_share(SpecKind.FULL, "H100-80GB") == 1
    assert (share.FULL, share.MIG, share.TIMESLICE) == (SpecKind.FULL, SpecKind.MIG, SpecKind.TIMESLICE)


def test_billing_prices_by_the_same_rule():
    assert rates.mig_share is mig_share
