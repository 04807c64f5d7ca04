"""Free placements need only the memory slices and the +me rule, for every catalogued product.

capacity/mig/layout.py's free_placements() and free_score() leave out the compute slices, the GPU-instance limit
and each profile's max_instances: the placement tables (reference/nvidia.md §1.3) already keep instances that do
not overlap within them. These tests assert that property of the catalogue, so a product added with a table that
does not imply it fails here, and check the answers against validate_layout(), which applies every rule.
"""

from functools import cache

import pytest

from capacity.mig.catalog import PRODUCTS
from capacity.mig.layout import Placement, fits, free_placements, free_score

PRODUCT_KEYS = sorted(PRODUCTS)


def _geometry(product):
    """What the layout rules read of a product; products equal here get the same answers, names aside."""
    rows = tuple(
        (p.compute_slices, p.memory_slices, p.max_instances, p.starts, p.has_media_extensions) for p in product.profiles
    )
    return product.compute_slices, product.memory_slices, product.max_gpu_instances, rows


# One product per geometry (the 7-slice boards share one table, the A30 has its own): the check below is the slow one.
GEOMETRY_KEYS = sorted({_geometry(PRODUCTS[key]): key for key in reversed(PRODUCT_KEYS)}.values())


def _span(profile, start):
    return set(range(start, start + profile.memory_slices))


def _disjoint_sets(places):
    """Every set of placements whose memory slices do not overlap, ignoring every counting rule."""
    found = []

    def extend(first, taken, chosen):
        found.append(list(chosen))
        for i in range(first, len(places)):
            profile, start = places[i]
            span = _span(profile, start)
            if not taken & span:
                chosen.append(places[i])
                extend(i + 1, taken | span, chosen)
                chosen.pop()

    extend(0, set(), [])
    return found


@cache
def _layouts(key):
    product = PRODUCTS[key]
    return _disjoint_sets([(p, s) for p in product.profiles for s in p.starts])


@pytest.mark.parametrize("key", PRODUCT_KEYS)
def test_instances_that_do_not_overlap_stay_within_the_compute_slices_and_the_instance_limit(key):
    product = PRODUCTS[key]
    layouts = _layouts(key)

    assert max(sum(p.compute_slices for p, _ in layout) for layout in layouts) == product.compute_slices
    assert max(len(layout) for layout in layouts) == product.max_gpu_instances


@pytest.mark.parametrize("key", PRODUCT_KEYS)
def test_only_a_media_profile_has_more_places_than_instances(key):
    # A +me profile's limit is the one-+me-per-GPU rule; every other profile fills all its places.
    for profile in PRODUCTS[key].profiles:
        most = max(len(layout) for layout in _disjoint_sets([(profile, s) for s in profile.starts]))
        if profile.has_media_extensions:
            assert profile.max_instances == 1, profile.name
        else:
            assert most == profile.max_instances, profile.name


@pytest.mark.parametrize("key", GEOMETRY_KEYS)
def test_free_placements_are_the_instances_validate_layout_would_add(key):
    product = PRODUCTS[key]
    every = [(p.name, s) for p in product.profiles for s in p.starts]
    layouts = [[(p.name, s) for p, s in layout] for layout in _layouts(key)]
    valid = [layout for layout in layouts if fits(product, [], fixed=layout)]
    assert len(valid) < len(layouts)  # a second +me is refused

    for layout in valid:
        placed = [Placement(name, s, product.profile(name).memory_slices) for name, s in layout]
        free = [(p.profile, p.start) for p in free_placements(product, placed)]
        taken = set().union(*(_span(product.profile(name), s) for name, s in layout))
        beside = [(name, s) for name, s in every if not taken & _span(product.profile(name), s)]
        expected = [extra for extra in beside if fits(product, [], fixed=[*layout, extra])]
        assert free == expected, layout
        sizes = [product.profile(name).memory_slices for name, _ in free]
        assert free_score(product, placed) == (max(sizes, default=0), len(free)), layout


@pytest.mark.parametrize("key", PRODUCT_KEYS)
def test_every_profile_lists_its_starts_in_increasing_order(key):
    # The placement search meets arrangements in this order and keeps the first of equally good ones: the lowest.
    for profile in PRODUCTS[key].profiles:
        assert list(profile.starts) == sorted(set(profile.starts)), profile.name
