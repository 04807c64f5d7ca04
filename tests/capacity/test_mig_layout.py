"""MIG layout parsing and validation against the placement facts in reference/nvidia.md §1.3."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity.mig import layout as layout_module
from capacity.mig.catalog import PRODUCTS, get_product
from capacity.mig.layout import (
    Placement,
    fits,
    free_placements,
    free_score,
    maximal_layouts,
    parse_demand,
    parse_layout,
    valid_layouts,
    validate_layout,
)

H100 = "H100-80GB"


def starts(result):
    return [(p.profile, p.start) for p in result.placements]


# --- parsing -----------------------------------------------------------------------------------


def test_parse_layout_forms():
    assert parse_layout("3g.40gb,3g.40gb") == ["3g.40gb", "3g.40gb"]
    assert parse_layout("3g.40gb=2") == ["3g.40gb", "3g.40gb"]
    assert parse_layout(" 4g.40gb , 1g.10gb = 3 ") == ["4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"]
    assert parse_layout("1g.10gb.me") == ["1g.10gb+me"]
    assert parse_layout("1g.10gb+me") == ["1g.10gb+me"]
    assert parse_layout("") == []
    assert parse_layout("   ") == []


@pytest.mark.parametrize(
    "text, token", [("3g.40gb,bogus", "bogus"), ("3g.40gb,", ""), ("3g=2", "3g=2"), ("1g.10gb=x", "1g.10gb=x")]
)
def test_parse_layout_names_the_bad_token(text, token):
    with pytest.raises(ValueError, match=f"bad layout entry '{token}'"):
        parse_layout(text)


def test_parse_layout_rejects_zero_count():
    with pytest.raises(ValueError, match="at least 1"):
        parse_layout("3g.40gb=0")


def test_parse_demand():
    assert parse_demand("3g.40gb=5,1g.10gb=9") == {"3g.40gb": 5, "1g.10gb": 9}
    assert parse_demand("1g.10gb,1g.10gb=2") == {"1g.10gb": 3}
    assert parse_demand("") == {}
    with pytest.raises(ValueError, match="'3g.40gb=-1'"):
        parse_demand("3g.40gb=-1")
    with pytest.raises(ValueError, match="at least 1"):
        parse_demand("3g.40gb=0")


# --- the H100 facts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout, expected",
    [
        ("4g.40gb,3g.40gb", [("4g.40gb", 0), ("3g.40gb", 4)]),
        ("3g.40gb=2", [("3g.40gb", 0), ("3g.40gb", 4)]),
        ("1g.10gb=7", [("1g.10gb", s) for s in range(7)]),
        ("2g.20gb=3,1g.10gb", [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)]),
        ("1g.20gb=4", [("1g.20gb", s) for s in (0, 2, 4, 6)]),
        ("7g.80gb", [("7g.80gb", 0)]),
        ("3g.40gb,2g.20gb,1g.10gb=2", [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]),
    ],
)
def test_h100_layouts_that_fit(layout, expected):
    result = validate_layout(H100, parse_layout(layout))
    assert result.valid and result.reason == ""
    assert starts(result) == expected
    assert [p.size for p in result.placements] == [get_product(H100).profile(n).memory_slices for n, _ in expected]


@pytest.mark.parametrize(
    "layout, reason",
    [
        ("3g.40gb=2,1g.10gb", "memory slices exhausted (needs 9 of 8)"),
        ("7g.80gb,1g.10gb", "compute slices exhausted (needs 8 of 7)"),
        ("4g.40gb,2g.20gb=2", "compute slices exhausted (needs 8 of 7)"),
        ("3g.40gb=3", "too many instances of 3g.40gb: 3 (max 2)"),
        ("4g.40gb=2", "too many instances of 4g.40gb: 2 (max 1)"),
        ("1g.10gb=8", "too many instances of 1g.10gb: 8 (max 7)"),
        ("1g.10gb=6,1g.10gb+me,1g.20gb", "too many instances: 8 (max 7)"),
        ("3g.20gb", "H100-80GB has no MIG profile '3g.20gb'"),
    ],
)
def test_h100_layouts_that_do_not_fit_say_why(layout, reason):
    result = validate_layout(H100, parse_layout(layout))
    assert not result.valid
    assert result.reason.startswith(reason)
    assert result.placements == []


def test_one_media_extension_per_gpu():
    # A30 allows one 1g+me and one 2g+me by profile, but the GPU has one set of media engines.
    result = validate_layout("A30-24GB", ["1g.6gb+me", "2g.12gb+me"])
    assert not result.valid
    assert result.reason.startswith("more than one +me instance (2)")


def test_resource_form_of_me_profiles_is_accepted():
    assert starts(validate_layout(H100, ["1g.10gb.me"])) == [("1g.10gb+me", 6)]


def test_gfd_product_name_is_accepted():
    assert validate_layout("NVIDIA-H100-80GB-HBM3", ["3g.40gb", "4g.40gb"]).valid


def test_unknown_product_raises():
    with pytest.raises(KeyError, match="unknown GPU product"):
        validate_layout("RTX-4090", ["1g.10gb"])


# --- fixed instances ------------------------------------------------------------------------------


def test_fixed_instances_stay_and_others_fit_around_them():
    result = validate_layout(H100, ["3g.40gb"], fixed=[("1g.10gb", 4)])
    assert starts(result) == [("3g.40gb", 0), ("1g.10gb", 4)]


def test_fixed_instance_blocks_the_only_start():
    result = validate_layout(H100, ["4g.40gb"], fixed=[("1g.10gb", 0)])
    assert not result.valid
    assert result.reason.startswith("no free placement for 4g.40gb")


def test_fixed_overlap_is_reported():
    result = validate_layout(H100, [], fixed=[("4g.40gb", 0), ("2g.20gb", 2)])
    assert not result.valid
    assert result.reason == "overlapping placements: 4g.40gb at 0 and 2g.20gb at 2"


def test_fixed_at_an_impossible_start_is_reported():
    result = validate_layout(H100, [], fixed=[("2g.20gb", 6)])
    assert result.reason == "2g.20gb cannot start at memory slice 6 (valid starts: 0, 2, 4)"


def test_placement_search_finds_the_arrangement_a_greedy_order_misses():
    # The MIG guide's known issue: 1g and 2g created first strand the 3g. The search moves them.
    result = validate_layout(H100, ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
    assert starts(result) == [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]


def test_single_small_instance_keeps_the_big_starts_free():
    # Same choice as the driver's default placement: a lone 1g goes to slice 6, keeping 4g/3g at 0.
    result = validate_layout(H100, ["1g.10gb"])
    assert starts(result) == [("1g.10gb", 6)]
    creatable = {(p.profile, p.start) for p in free_placements(H100, result.placements)}
    assert ("4g.40gb", 0) in creatable and ("3g.40gb", 0) in creatable
    assert free_score(H100, result.placements)[0] == 4


def test_free_placements_respect_compute_and_media():
    full = validate_layout(H100, ["4g.40gb", "3g.40gb"]).placements
    assert free_placements(H100, full) == []
    assert free_score(H100, full) == (0, 0)
    with_me = [Placement("1g.10gb+me", 0, 1)]
    assert all(not p.profile.endswith("+me") for p in free_placements(H100, with_me))


# --- every product ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "product, good, bad",
    [
        ("A100-40GB", "4g.20gb,3g.20gb", "3g.20gb=2,1g.5gb"),
        ("A100-80GB", "3g.40gb,2g.20gb,1g.10gb=2", "7g.80gb,1g.10gb"),
        ("A30-24GB", "2g.12gb,1g.6gb=2", "4g.24gb,1g.6gb"),
        ("H100-80GB", "1g.20gb=4", "1g.20gb=5"),
        ("H200-141GB", "3g.71gb,4g.71gb", "3g.71gb=2,2g.35gb"),
    ],
)
def test_each_product(product, good, bad):
    assert validate_layout(product, parse_layout(good)).valid
    assert not validate_layout(product, parse_layout(bad)).valid


def test_a30_has_four_slices_and_four_instances():
    assert starts(validate_layout("A30-24GB", parse_layout("1g.6gb=4"))) == [("1g.6gb", s) for s in range(4)]
    assert validate_layout("A30-24GB", parse_layout("1g.6gb=4,1g.6gb+me")).reason == "too many instances: 5 (max 4)"
    assert validate_layout("A30-24GB", ["4g.24gb"]).valid
    assert not validate_layout("A30-24GB", ["2g.12gb", "2g.12gb", "2g.12gb+me"]).valid


def test_profiles_of_another_product_are_refused():
    result = validate_layout("A30-24GB", ["3g.40gb"])
    assert not result.valid
    assert "A30-24GB has no MIG profile '3g.40gb'" in result.reason


# --- the precomputed layout table agrees with brute force ------------------------------------------------


def brute_force_fits(product, names):
    """Try every start of every instance, abandoning a branch at its first overlap; the rules written out again."""
    profiles = [product.profile(n) for n in names]
    if (
        len(profiles) > product.max_gpu_instances
        or sum(p.compute_slices for p in profiles) > product.compute_slices
        or sum(p.name.endswith("+me") for p in profiles) > 1
        or any(names.count(p.name) > p.max_instances for p in profiles)
    ):
        return False

    def place(i, used):
        if i == len(profiles):
            return True
        p = profiles[i]
        for start in p.starts:
            slices = set(range(start, start + p.memory_slices))
            if max(slices) < product.memory_slices and not used & slices and place(i + 1, used | slices):
                return True
        return False

    return place(0, set())


@pytest.mark.parametrize("key", sorted(PRODUCTS))
def test_valid_layouts_match_brute_force(key):
    product = PRODUCTS[key]
    table = set(valid_layouts(key))
    for layout in table:
        assert brute_force_fits(product, list(layout)), layout
    for layout in maximal_layouts(key):
        assert layout in table
        for p in product.profiles:
            assert not brute_force_fits(product, [*layout, p.name])
    # Nothing that fits is missing: every fitting layout grows from a smaller fitting one.
    order = [p.name for p in product.profiles]
    for layout in table | {()}:
        for name in order:
            grown = tuple(sorted([*layout, name], key=order.index))
            assert (grown in table) == brute_force_fits(product, list(grown))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_validate_layout_agrees_with_brute_force(data):
    key = data.draw(st.sampled_from(sorted(PRODUCTS)))
    product = PRODUCTS[key]
    names = data.draw(st.lists(st.sampled_from([p.name for p in product.profiles]), max_size=8))
    result = validate_layout(product, names)
    assert result.valid == brute_force_fits(product, names)
    if result.valid:
        assert sorted(p.profile for p in result.placements) == sorted(names)
        used = [s for p in result.placements for s in range(p.start, p.start + p.size)]
        assert len(used) == len(set(used))
        assert all(p.start in product.profile(p.profile).starts for p in result.placements)
        assert [p.start for p in result.placements] == sorted(p.start for p in result.placements)
    else:
        assert result.reason


def test_among_equally_useful_arrangements_the_profile_with_more_compute_takes_the_lower_start():
    # 2g.10gb and 1g.10gb both take two memory slices; both arrangements leave the same free space, and the
    # search places larger instances first (memory, then compute), so the lowest-starts tie-break gives the
    # 2g.10gb slice 0. Sorting same-size profiles by name instead would put a 1g.10gb there.
    result = validate_layout("A100-40GB", parse_layout("1g.5gb,1g.10gb=2,2g.10gb"))

    assert result.valid
    assert starts(result) == [("2g.10gb", 0), ("1g.10gb", 2), ("1g.5gb", 4), ("1g.10gb", 6)]
    pinned = validate_layout("A100-40GB", parse_layout("1g.10gb=2,2g.10gb"), fixed=[("1g.10gb", 0)])
    assert starts(pinned) == [("1g.10gb", 0), ("2g.10gb", 2), ("1g.10gb", 4), ("1g.10gb", 6)]


def test_a_layout_answer_cannot_be_changed_by_its_reader():
    # validate_layout's answers come from a cache shared by every caller (the planner asks thousands of times)
    result = validate_layout(H100, parse_layout("3g.40gb"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.valid = False
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.placements[0].start = 4


def test_the_overlap_reason_is_the_same_whichever_order_the_fixed_instances_come_in():
    fixed = [("3g.40gb", 0), ("1g.10gb", 0)]
    answers = {validate_layout(H100, [], fixed=order).reason for order in (fixed, fixed[::-1])}

    assert answers == {"overlapping placements: 1g.10gb at 0 and 3g.40gb at 0"}


def test_valid_layouts_lists_each_layout_once_with_names_in_catalog_order():
    for key in ("A100-40GB", "A30-24GB"):
        order = [p.name for p in PRODUCTS[key].profiles]
        layouts = valid_layouts(key)

        assert len(set(layouts)) == len(layouts)
        assert all(list(layout) == sorted(layout, key=order.index) for layout in layouts)
        assert layouts[0] == (order[0],)
        assert layouts[-1] == (order[-1],)


def test_the_overlap_reason_names_the_fixed_instances_by_start_not_by_name():
    fixed = [("1g.10gb", 6), ("3g.40gb", 4)]
    for order in (fixed, fixed[::-1]):
        assert validate_layout(H100, [], fixed=order).reason == (
            "overlapping placements: 3g.40gb at 4 and 1g.10gb at 6"
        )
        assert not fits(H100, [], fixed=order)


def test_repeated_questions_are_answered_from_the_cache_until_it_is_cleared():
    layout_module.clear_caches()
    for cached in (layout_module._validate, layout_module._fits, valid_layouts, maximal_layouts):
        assert cached.cache_info().currsize == 0
    first = validate_layout(H100, ["3g.40gb", "1g.10gb"], fixed=[("3g.40gb", 4)])
    again = validate_layout(H100, ["1g.10gb", "3g.40gb"], fixed=[("3g.40gb", 4)])

    assert again is not first and again == first
    assert layout_module._validate.cache_info().hits == 1
    assert fits(H100, ["2g.20gb"]) and fits(H100, ["2g.20gb"])
    assert layout_module._fits.cache_info().hits == 1
    assert valid_layouts("A30-24GB") is valid_layouts("A30-24GB")
    assert maximal_layouts("A30-24GB") is maximal_layouts("A30-24GB")
    layout_module.clear_caches()
    for cached in (layout_module._validate, layout_module._fits, valid_layouts, maximal_layouts):
        assert cached.cache_info().currsize == 0
