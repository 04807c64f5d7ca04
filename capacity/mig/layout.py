"""Validate a MIG layout for one GPU and find where its instances go.

Pure Python over the catalog, no Django: the planner calls validate_layout thousands of times, so
every answer is cached per (product, profile multiset, fixed instances).

Rules (reference/nvidia.md §1.1-1.3): placements are (start, size) in memory slices and may not
overlap; compute slices add up to at most product.compute_slices; at most product.max_gpu_instances
instances, at most profile.max_instances of each profile and one "+me" instance per GPU.

validate_layout and fits check every rule. free_placements and free_score need only the memory slices and
the "+me" rule: for every catalogued product the placement tables alone keep instances that do not overlap
within the compute slices and the instance limits (tests/capacity/test_mig_free_placements.py asserts it).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import combinations, groupby

from .catalog import Product, Profile, get_product

_TOKEN = re.compile(r"^(?P<name>[0-9]+g\.[0-9]+gb(?:[+.]me)?)(?:\s*=\s*(?P<count>[0-9]+))?$")


@dataclass(frozen=True)
class Placement:
    """One GPU instance: a profile at a memory-slice range [start, start + size)."""

    profile: str
    start: int
    size: int

    def to_dict(self) -> dict[str, str | int]:
        return {"profile": self.profile, "start": self.start, "size": self.size}


@dataclass(frozen=True)
class LayoutResult:
    valid: bool
    reason: str
    placements: list[Placement]

    def to_dict(self) -> dict:
        return {"valid": self.valid, "reason": self.reason, "placements": [p.to_dict() for p in self.placements]}


def parse_layout(text: str) -> list[str]:
    """Parse "4g.40gb,1g.10gb=3" into ["4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"].

    "" means no instances. Names are not checked against a product here (validate_layout does),
    but "1g.10gb.me" is normalised to the catalog's "1g.10gb+me".
    """
    names: list[str] = []
    if not text.strip():
        return names
    for raw in text.split(","):
        token = raw.strip()
        match = _TOKEN.match(token)
        if match is None:
            raise ValueError(f"bad layout entry {token!r}: expected a profile like 3g.40gb or 3g.40gb=2")
        count = int(match["count"]) if match["count"] is not None else 1
        if count < 1:
            raise ValueError(f"bad layout entry {token!r}: the count must be at least 1")
        name = match["name"]
        if name.endswith(".me"):
            name = name[: -len(".me")] + "+me"
        names.extend([name] * count)
    return names


def parse_demand(text: str) -> dict[str, int]:
    """Parse "3g.40gb=5,1g.10gb=9" into {"3g.40gb": 5, "1g.10gb": 9}; repeated names add up."""
    return dict(Counter(parse_layout(text)))


def validate_layout(
    product: Product | str,
    profiles: Iterable[str],
    fixed: Iterable[tuple[str, int]] = (),
    prefer: Iterable[tuple[str, int]] = (),
) -> LayoutResult:
    """Say whether `profiles` fit on one GPU beside the `fixed` instances, and where they go.

    `fixed` are (profile, start) instances that already exist and stay where they are. Among the
    assignments that fit, the one leaving the most useful free space wins (see free_score); ties go
    to the one reusing most of `prefer` (existing instances, so fewer are destroyed and recreated),
    then to the lowest starts, so the answer is deterministic. Placements come back sorted by start.
    """
    product = _product(product)
    names = tuple(sorted(profiles))
    pinned = _pinned(fixed)
    preferred = tuple(sorted((name, int(start)) for name, start in prefer))
    valid, reason, found = _validate(product.key, names, pinned, preferred)
    return LayoutResult(valid, reason, [Placement(*p) for p in found])


def fits(product: Product | str, profiles: Iterable[str], fixed: Iterable[tuple[str, int]] = ()) -> bool:
    """validate_layout(...).valid without choosing the best arrangement: for searches that only need yes or no."""
    product = _product(product)
    pinned = _pinned(fixed)
    return _fits(product.key, tuple(sorted(profiles)), pinned)


def free_placements(product: Product | str, placements: Iterable[Placement]) -> list[Placement]:
    """The instances that could be created now beside `placements`, each (profile, start) once."""
    product = _product(product)
    state = _State.of([(product.profile(p.profile), p.start) for p in placements])
    return [Placement(p.name, s, p.memory_slices) for p, s in _creatable(product, state)]


def free_score(product: Product | str, placements: Iterable[Placement]) -> tuple[int, int]:
    """How useful a GPU's free space is: (largest creatable instance in memory slices, creatable count).

    Raw contiguous free slices overstate it: slice 7 only serves 1g.20gb-class and 7g instances, and a
    1g at slice 0 wastes the 4g/3g starts. Counting what could actually be created captures both.
    """
    product = _product(product)
    state = _State.of([(product.profile(p.profile), p.start) for p in placements])
    return _score(product, state)


@cache  # one entry per catalogued product
def valid_layouts(product_key: str) -> tuple[tuple[str, ...], ...]:
    """Every non-empty profile multiset that fits on one empty GPU, names in catalog order.

    A few hundred per product; the set is downward closed (drop an instance and it still fits).
    """
    product = get_product(product_key)
    order = [p.name for p in product.profiles]
    found: list[tuple[str, ...]] = []

    def extend(current: list[str], first: int) -> None:
        for i in range(first, len(order)):
            candidate = [*current, order[i]]
            if fits(product, candidate):
                found.append(tuple(candidate))
                extend(candidate, i)

    extend([], 0)
    return tuple(found)


@cache  # one entry per catalogued product
def maximal_layouts(product_key: str) -> tuple[tuple[str, ...], ...]:
    """The valid layouts to which no further instance can be added."""
    product = get_product(product_key)
    return tuple(
        layout
        for layout in valid_layouts(product_key)
        if not any(fits(product, [*layout, p.name]) for p in product.profiles)
    )


def clear_caches() -> None:
    """Forget every cached answer, so a benchmark can time a cold start."""
    _validate.cache_clear()
    _fits.cache_clear()
    valid_layouts.cache_clear()
    maximal_layouts.cache_clear()


def _product(product: Product | str) -> Product:
    return product if isinstance(product, Product) else get_product(product)


def _pinned(fixed: Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """The fixed instances in one order (by start, then name), whatever order they came in: one cache entry."""
    return tuple(sorted(((name, int(start)) for name, start in fixed), key=lambda f: (f[1], f[0])))


@dataclass
class _State:
    """Occupancy of one GPU, as free placements need it: the memory slices taken, and whether a +me is there."""

    mask: int = 0
    media: bool = False

    @classmethod
    def of(cls, placed: Iterable[tuple[Profile, int]]) -> _State:
        state = cls()
        for profile, start in placed:
            state.add(profile, start)
        return state

    def add(self, profile: Profile, start: int) -> None:
        self.mask |= _mask(profile, start)
        self.media = self.media or profile.has_media_extensions


def _mask(profile: Profile, start: int) -> int:
    return ((1 << profile.memory_slices) - 1) << start


def _creatable(product: Product, state: _State) -> list[tuple[Profile, int]]:
    """Each (profile, start) whose memory slices are free, but no second +me instance.

    No compute, instance-count or per-profile clause: beside instances that do not overlap they never bind for
    a catalogued product (see the module's docstring); validate_layout still checks them (_check).
    """
    return [
        (p, s)
        for p in product.profiles
        if not (p.has_media_extensions and state.media)
        for s in p.starts
        if not state.mask & _mask(p, s)
    ]


def _score(product: Product, state: _State) -> tuple[int, int]:
    creatable = _creatable(product, state)
    return max((p.memory_slices for p, _ in creatable), default=0), len(creatable)


@lru_cache(maxsize=65536)
def _validate(
    product_key: str,
    names: tuple[str, ...],
    fixed: tuple[tuple[str, int], ...],
    prefer: tuple[tuple[str, int], ...],
) -> tuple[bool, str, tuple[tuple[str, int, int], ...]]:
    checked = _check(product_key, names, fixed)
    if isinstance(checked, str):
        return False, checked, ()
    product, pinned, new = checked
    best = _assign(product, pinned, new, set(prefer))
    if best is None:
        blocker = next(p for i, p in enumerate(new) if _assign(product, pinned, new[: i + 1], None) is None)
        starts = ", ".join(map(str, blocker.starts))
        return (
            False,
            f"no free placement for {blocker.name} (size {blocker.memory_slices}, starts {starts}) "
            f"beside the other instances",
            (),
        )
    ordered = sorted((s, p.name, p.memory_slices) for p, s in best)
    return True, "", tuple((name, start, size) for start, name, size in ordered)


@lru_cache(maxsize=65536)
def _fits(product_key: str, names: tuple[str, ...], fixed: tuple[tuple[str, int], ...]) -> bool:
    checked = _check(product_key, names, fixed)
    return not isinstance(checked, str) and _assign(*checked, None) is not None


def _check(
    product_key: str, names: tuple[str, ...], fixed: tuple[tuple[str, int], ...]
) -> str | tuple[Product, list[tuple[Profile, int]], list[Profile]]:
    """The counting rules; a reason, or what the placement search needs (new instances largest first)."""
    product = get_product(product_key)
    try:
        new = [product.profile(n) for n in names]
        pinned = [(product.profile(n), s) for n, s in fixed]
    except KeyError as exc:
        return exc.args[0]

    for i, (profile, start) in enumerate(pinned):
        if start not in profile.starts:
            starts = ", ".join(map(str, profile.starts))
            return f"{profile.name} cannot start at memory slice {start} (valid starts: {starts})"
        for other, other_start in pinned[:i]:
            if _mask(other, other_start) & _mask(profile, start):
                return f"overlapping placements: {other.name} at {other_start} and {profile.name} at {start}"

    everything = [p for p, _ in pinned] + new
    counts = Counter(p.name for p in everything)
    for p in product.profiles:
        if counts[p.name] > p.max_instances:
            return f"too many instances of {p.name}: {counts[p.name]} (max {p.max_instances})"
    media = sum(p.has_media_extensions for p in everything)
    if media > 1:
        return f"more than one +me instance ({media}); a GPU has one set of media extensions"
    if len(everything) > product.max_gpu_instances:
        return f"too many instances: {len(everything)} (max {product.max_gpu_instances})"
    compute = sum(p.compute_slices for p in everything)
    if compute > product.compute_slices:
        return f"compute slices exhausted (needs {compute} of {product.compute_slices})"
    memory = sum(p.memory_slices for p in everything)
    if memory > product.memory_slices:
        return f"memory slices exhausted (needs {memory} of {product.memory_slices})"
    # Largest first (memory, then compute), so that the search fails fast, by name among equals (a stable sort
    # keeps the name order); identical profiles end up side by side (one group each).
    new.sort(key=lambda p: p.name)
    new.sort(key=lambda p: (p.memory_slices, p.compute_slices), reverse=True)
    return product, pinned, new


def _assign(
    product: Product, pinned: list[tuple[Profile, int]], new: list[Profile], prefer: set[tuple[str, int]] | None
) -> list[tuple[Profile, int]] | None:
    """Place `new` beside `pinned` by exhaustive search over starts (at most 7 instances, 7 starts each).

    With `prefer` None, the first arrangement found; otherwise the best one (see validate_layout). The search
    meets the arrangements in increasing order of their starts (every catalogued profile lists its starts in
    increasing order), so among equally good ones the first found, which is kept, has the lowest starts.
    """
    mask = 0
    for p, s in pinned:
        mask |= _mask(p, s)
    groups = [(profile, len(list(same))) for profile, same in groupby(new)]
    arrangements = _arrangements(groups, mask)
    if prefer is None:
        found = next(arrangements, None)
        return None if found is None else pinned + found
    best: list[tuple[Profile, int]] | None = None
    best_key: tuple[tuple[int, int], int] | None = None
    for chosen in arrangements:
        layout = pinned + chosen
        key = (_score(product, _State.of(layout)), sum((p.name, s) in prefer for p, s in chosen))
        if best_key is None or key > best_key:
            best, best_key = layout, key
    return best


def _arrangements(groups: list[tuple[Profile, int]], mask: int) -> Iterator[list[tuple[Profile, int]]]:
    """Each way to place `count` instances of each group's profile on the slices `mask` leaves free.

    Identical instances take increasing starts (one combination each), so no arrangement comes twice.
    """
    if not groups:
        yield []
        return
    (profile, count), rest = groups[0], groups[1:]
    for starts in combinations(profile.starts, count):
        taken = mask
        for start in starts:
            if taken & _mask(profile, start):
                break
            taken |= _mask(profile, start)
        else:
            for tail in _arrangements(rest, taken):
                yield [(profile, start) for start in starts] + tail
