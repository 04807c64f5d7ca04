"""Plan MIG layouts: the fewest GPUs for a demand, or the fewest changes to GPUs that exist.

Pure and deterministic (no Django, no randomness, no clocks).

Fewest GPUs is a covering problem over "patterns": the count vectors of profiles that fit on one GPU
(layout.valid_layouts, a few dozen once projected onto the demanded profiles). Small demands are
solved exactly by iterative deepening with memoised failures; large ones by the configuration LP
(exact simplex in fractions, a handful of rows), rounding its solution down and solving the leftover
demand exactly. The LP value is a lower bound, so every Plan says how far from optimal it can be.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from .catalog import Product, Profile, get_product
from .layout import Placement, fits, free_placements, free_score, validate_layout
from .layout import clear_caches as clear_layout_caches
from .patterns import Vector, pattern_space

# Exact search runs on the whole demand when its lower bound is at most this many GPUs and the LP
# rounding did not already meet the bound; beyond it the search space grows too fast to promise.
EXACT_MAX_GPUS = 12


@dataclass
class Plan:
    """Per-GPU layouts that meet a demand; `lower_bound` proves how close to optimal `gpus` is."""

    product: str
    gpus: int
    layouts: list[list[Placement]]
    unmet: dict[str, int] = field(default_factory=dict)
    lower_bound: int = 0

    @property
    def optimal(self) -> bool:
        return self.gpus == self.lower_bound

    def to_dict(self) -> dict:
        return {
            "product": self.product,
            "gpus": self.gpus,
            "lower_bound": self.lower_bound,
            "optimal": self.optimal,
            "layouts": [[p.to_dict() for p in layout] for layout in self.layouts],
            "unmet": dict(self.unmet),
        }


def normalise_demand(product: Product | str, demand: Mapping[str, int]) -> dict[str, int]:
    """Canonical profile names with positive counts; ValueError names the bad entry."""
    product = _product(product)
    out: dict[str, int] = {}
    for name, count in demand.items():
        try:
            profile = product.profile(name)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"demand for {name} must be a whole number >= 0, not {count!r}")
        if count:
            out[profile.name] = out.get(profile.name, 0) + count
    return out


def plan_fewest_gpus(product: Product | str, demand: Mapping[str, int]) -> Plan:
    """Layouts that meet `demand` exactly on as few GPUs as possible.

    Exact (proven by the search) whenever the lower bound is at most EXACT_MAX_GPUS; above that,
    LP rounding with an exact tail, never more than one GPU per demanded profile above the LP bound
    and in practice on it (Plan.optimal says when it is proven).
    """
    product = _product(product)
    need = normalise_demand(product, demand)
    if not need:
        return Plan(product.key, 0, [], lower_bound=0)
    space = pattern_space(product.key, tuple(sorted(need, key=lambda n: _size_key(product.profile(n)))))
    target = tuple(need[n] for n in space.names)

    value, columns = space.lp(target)
    bound = max(math.ceil(value), space.bound(target))
    vectors = _trim(space.rounded(target, columns), target)
    if len(vectors) > bound and bound <= EXACT_MAX_GPUS:
        better, complete = space.exact(target, len(vectors) - 1)
        if better is not None:
            vectors = better
        if complete:  # the search tried every count from the bound up: what it holds now is optimal
            bound = len(vectors)
    layouts = [space.layout(v) for v in vectors]
    return Plan(product.key, len(layouts), layouts, lower_bound=bound)


def first_fit(product: Product | str, demand: Mapping[str, int]) -> Plan:
    """The naive baseline: largest profiles first, each into the first GPU with a free placement."""
    product = _product(product)
    need = normalise_demand(product, demand)
    layouts: list[list[Placement]] = []
    for name in sorted(need, key=lambda n: _size_key(product.profile(n))):
        first = 0  # GPUs before this one had no room for `name`; adding instances never makes room
        for _ in range(need[name]):
            spot = None
            while first < len(layouts) and (spot := _first_spot(product, layouts[first], name)) is None:
                first += 1
            if spot is None:
                layouts.append([])
                spot = _first_spot(product, layouts[first], name)
            layouts[first].append(spot)
    for layout in layouts:
        layout.sort(key=lambda p: p.start)
    bound = 0
    if need:
        space = pattern_space(product.key, tuple(sorted(need, key=lambda n: _size_key(product.profile(n)))))
        bound = space.bound(tuple(need[n] for n in space.names))
    return Plan(product.key, len(layouts), layouts, lower_bound=bound)


def clear_caches() -> None:
    """Forget cached pattern spaces and layouts, so a benchmark can time a cold start."""
    pattern_space.cache_clear()
    clear_layout_caches()


def _first_spot(product: Product, layout: list[Placement], name: str) -> Placement | None:
    return next((p for p in free_placements(product, layout) if p.profile == name), None)


def _product(product: Product | str) -> Product:
    return product if isinstance(product, Product) else get_product(product)


def _size_key(profile: Profile) -> tuple[int, int, str]:
    return (-profile.memory_slices, -profile.compute_slices, profile.name)


def _trim(vectors: list[Vector], target: Vector) -> list[Vector]:
    """Drop surplus instances (from the last GPUs first) so the plan creates exactly the demand."""
    surplus = [sum(v[i] for v in vectors) - t for i, t in enumerate(target)]
    out = [list(v) for v in vectors]
    for v in reversed(out):
        for i, extra in enumerate(surplus):
            drop = min(extra, v[i])
            v[i] -= drop
            surplus[i] -= drop
    return [tuple(v) for v in out if any(v)]


# The exact search for plan_onto_gpus visits GPUs x demand states x layouts; above this it switches
# to the heuristic (Reconfiguration.exact says which ran).
EXACT_REWORK_BUDGET = 400_000


@dataclass(frozen=True)
class GpuState:
    """One GPU as it is now: its instances as (profile, start), and the starts of those in use.

    Allocated instances serve someone already: they stay where they are and do not count toward
    the demand. Unallocated ones of a demanded profile do count, as long as the GPU is not touched.
    """

    gpu: str
    instances: tuple[tuple[str, int], ...] = ()
    allocated: frozenset[int] = frozenset()
    allowed: frozenset[str] | None = None  # the profiles its node's tier may carry (capacity.tiers); None: any

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", tuple((name, int(start)) for name, start in self.instances))
        object.__setattr__(self, "allocated", frozenset(int(s) for s in self.allocated))
        if self.allowed is not None:
            object.__setattr__(self, "allowed", frozenset(self.allowed))


@dataclass
class GpuChange:
    """What to do to one GPU; untouched GPUs only keep."""

    gpu: str
    touched: bool
    keep: list[Placement]
    destroy: list[Placement]
    create: list[Placement]
    serves: dict[str, int]

    def to_dict(self) -> dict:
        return {
            "gpu": self.gpu,
            "touched": self.touched,
            "keep": [p.to_dict() for p in self.keep],
            "destroy": [p.to_dict() for p in self.destroy],
            "create": [p.to_dict() for p in self.create],
            "serves": dict(self.serves),
        }


@dataclass
class Reconfiguration:
    """New layouts for existing GPUs; `exact` is False when the heuristic planned it."""

    product: str
    changes: list[GpuChange]
    met: dict[str, int]
    unmet: dict[str, int]
    touched: int
    exact: bool

    def to_dict(self) -> dict:
        return {
            "product": self.product,
            "touched": self.touched,
            "exact": self.exact,
            "met": dict(self.met),
            "unmet": dict(self.unmet),
            "changes": [c.to_dict() for c in self.changes],
        }


def plan_onto_gpus(product: Product | str, gpus: Iterable[GpuState], demand: Mapping[str, int]) -> Reconfiguration:
    """Choose new layouts for existing GPUs.

    A GPU whose state names `allowed` profiles (its tier's policy) is only ever given those: a reshaped
    GPU keeps its allocated instances and otherwise holds allowed profiles only.

    Objectives, in order: meet the most demand weighted by compute slices; touch the fewest GPUs (a
    GPU is touched when its instance set changes); leave the most useful free space (layout.free_score,
    summed). Allocated instances never move. Touched GPUs keep only allocated instances and instances
    that serve the demand, reusing existing ones where that costs no free space.

    Exact (dynamic programming over GPUs x remaining demand) while GPUs x demand states x layouts
    stays under EXACT_REWORK_BUDGET. Above it: keep serving instances, give the fewest-GPUs plan of the
    remaining demand to GPUs that lose nothing by being reshaped, then greedily reshape the GPU class
    with the largest weighted gain; not proven optimal.
    """
    product = _product(product)
    need = normalise_demand(product, demand)
    names = tuple(sorted(need, key=lambda n: _size_key(product.profile(n))))
    rework = _Rework(product, names, tuple(need[n] for n in names), [_Gpu(product, g, names) for g in gpus])
    grid = math.prod(c + 1 for c in rework.demand)
    work = grid * sum(len(g.completions) for g in rework.gpus)
    exact = work <= EXACT_REWORK_BUDGET
    choice = rework.exact() if exact else rework.heuristic()
    return rework.result(choice, exact)


class _Gpu:
    """One GPU prepared for planning: its pinned instances, serving supply and possible layouts."""

    def __init__(self, product: Product, state: GpuState, names: tuple[str, ...]) -> None:
        current = validate_layout(product, [], fixed=state.instances)
        if not current.valid:
            raise ValueError(f"GPU {state.gpu}: {current.reason}")
        starts = {p.start for p in current.placements}
        if not state.allocated <= starts:
            missing = ", ".join(map(str, sorted(state.allocated - starts)))
            raise ValueError(f"GPU {state.gpu}: no instance starts at allocated slice(s) {missing}")
        self.product = product
        self.state = state
        self.names = names
        self.current = current.placements
        self.pinned = tuple((p.profile, p.start) for p in self.current if p.start in state.allocated)
        self.idle = [p for p in self.current if p.start not in state.allocated]
        self.supply = tuple(sum(p.profile == n for p in self.idle) for n in names)
        self.score = free_score(product, self.current)
        self.completions = tuple(v for v in _completions(product.key, names, self.pinned) if self.admits(v))
        self.key = (self.pinned, tuple(self.current), state.allowed)  # GPUs with equal keys are interchangeable
        self.finals: dict[Vector, tuple[list[Placement], bool, tuple[int, int]]] = {}

    def admits(self, v: Vector) -> bool:
        """May the GPU be reshaped to serve `v`? Only with profiles its tier allows."""
        allowed = self.state.allowed
        return allowed is None or all(not c or n in allowed for n, c in zip(self.names, v, strict=True))

    def final(self, v: Vector) -> tuple[list[Placement], bool, tuple[int, int]]:
        """Placements if reshaped to serve v, whether that touches the GPU, and the free score."""
        if v not in self.finals:
            wanted = [n for n, c in zip(self.names, v, strict=True) for _ in range(c)]
            prefer = [(p.profile, p.start) for p in self.idle]
            placements = validate_layout(self.product, wanted, fixed=self.pinned, prefer=prefer).placements
            self.finals[v] = (placements, placements != self.current, free_score(self.product, placements))
        return self.finals[v]


@lru_cache(maxsize=1024)
def _completions(product_key: str, names: tuple[str, ...], pinned: tuple[tuple[str, int], ...]) -> tuple[Vector, ...]:
    """Every count vector over `names` that fits beside the pinned instances, the zero vector first."""
    product = get_product(product_key)
    found: list[Vector] = []

    def extend(v: list[int], first: int) -> None:
        found.append(tuple(v))
        for i in range(first, len(names)):
            v[i] += 1
            wanted = [n for n, c in zip(names, v, strict=True) for _ in range(c)]
            if fits(product, wanted, fixed=pinned):
                extend(v, i)
            v[i] -= 1

    extend([0] * len(names), 0)
    return tuple(found)


class _Rework:
    """The plan_onto_gpus problem; a choice is, per GPU, None (untouched) or the vector it serves."""

    def __init__(self, product: Product, names: tuple[str, ...], demand: Vector, gpus: list[_Gpu]) -> None:
        self.product = product
        self.names = names
        self.demand = demand
        self.gpus = gpus
        self.weights = tuple(product.profile(n).compute_slices for n in names)
        shared: dict[tuple, dict] = {}
        for gpu in gpus:  # interchangeable GPUs share their answers
            gpu.finals = shared.setdefault(gpu.key, gpu.finals)

    def total(self, vectors: Iterable[Vector]) -> list[int]:
        total = [0] * len(self.names)
        for v in vectors:
            total = [t + a for t, a in zip(total, v, strict=True)]
        return total

    def met_weight(self, supply: Iterable[int]) -> int:
        return sum(w * min(s, d) for w, s, d in zip(self.weights, supply, self.demand, strict=True))

    def exact(self) -> list[Vector | None]:
        """Backward dynamic programme over (GPU, remaining demand); costs compare lexicographically."""
        grid = list(itertools.product(*(range(c + 1) for c in self.demand)))
        later = {r: (sum(w * c for w, c in zip(self.weights, r, strict=True)), 0, 0, 0) for r in grid}
        picks: list[dict[Vector, Vector | None]] = []
        for gpu in reversed(self.gpus):
            here: dict[Vector, tuple[int, int, int, int]] = {}
            pick: dict[Vector, Vector | None] = {}
            for r in grid:
                rest = tuple(max(a - b, 0) for a, b in zip(r, gpu.supply, strict=True))
                best = _plus(later[rest], (0, 0, -gpu.score[0], -gpu.score[1]))
                chosen = None
                for v in gpu.completions:
                    if any(b > a for a, b in zip(r, v, strict=True)):
                        continue
                    _, touched, score = gpu.final(v)
                    if not touched:
                        continue
                    cost = _plus(later[tuple(a - b for a, b in zip(r, v, strict=True))], (0, 1, -score[0], -score[1]))
                    if cost < best:
                        best, chosen = cost, v
                here[r], pick[r] = best, chosen
            later = here
            picks.append(pick)
        picks.reverse()
        choice: list[Vector | None] = []
        r = self.demand
        for gpu, pick in zip(self.gpus, picks, strict=True):
            v = pick[r]
            choice.append(v)
            served = gpu.supply if v is None else v
            r = tuple(max(a - b, 0) for a, b in zip(r, served, strict=True))
        return choice

    def heuristic(self) -> list[Vector | None]:
        """Keep what serves; reshape lossless GPUs to the fewest-GPUs plan; then greedy by class."""
        choice: list[Vector | None] = [None] * len(self.gpus)
        supply = self.total(g.supply for g in self.gpus)
        rest = tuple(max(d - s, 0) for d, s in zip(self.demand, supply, strict=True))
        if not any(rest):
            return choice
        # GPUs whose serving instances are surplus can be reshaped for free; empty ones first.
        free = []
        for i in sorted(range(len(self.gpus)), key=lambda i: (bool(self.gpus[i].current), i)):
            gpu = self.gpus[i]
            if gpu.pinned:
                continue
            without = [s - u for s, u in zip(supply, gpu.supply, strict=True)]
            if self.met_weight(without) == self.met_weight(supply):
                supply = without
                free.append(i)
        rest = tuple(max(d - s, 0) for d, s in zip(self.demand, supply, strict=True))
        space = pattern_space(self.product.key, self.names)
        patterns = sorted(_trim(space.rounded(rest, space.lp(rest)[1]), rest), key=space.weight, reverse=True)
        for v in patterns:  # each to the first free GPU whose tier allows it; the rest: greedy below
            i = next((i for i in free if self.gpus[i].admits(v)), None)
            if i is not None:
                free.remove(i)
                choice[i] = v
                supply = [s + a for s, a in zip(supply, v, strict=True)]
        for i in free:  # not needed after all: they keep serving
            supply = [s + u for s, u in zip(supply, self.gpus[i].supply, strict=True)]
        self._greedy(choice, supply)
        return choice

    def _greedy(self, choice: list[Vector | None], supply: list[int]) -> None:
        """Reshape untouched GPUs, a class at a time, while that raises the weighted met demand."""
        classes: dict[tuple, list[int]] = {}
        for i, gpu in enumerate(self.gpus):
            if choice[i] is None:
                classes.setdefault(gpu.key, []).append(i)
        while True:
            base = self.met_weight(supply)
            best = None
            for members in classes.values():
                if not members:
                    continue
                gpu = self.gpus[members[0]]
                without = [s - u for s, u in zip(supply, gpu.supply, strict=True)]
                room = tuple(max(d - s, 0) for d, s in zip(self.demand, without, strict=True))
                for v in {tuple(min(a, b) for a, b in zip(v, room, strict=True)) for v in gpu.completions}:
                    placements, touched, score = gpu.final(v)
                    if not touched:
                        continue
                    gain = self.met_weight([s + a for s, a in zip(without, v, strict=True)]) - base
                    key = (gain, score, -members[0], v)
                    if gain > 0 and (best is None or key > best[0]):
                        best = (key, members, v, without)
            if best is None:
                return
            _, members, v, without = best
            # Apply to as many GPUs of the class as keep the same gain each, at once.
            gpu = self.gpus[members[0]]
            delta = [a - u for a, u in zip(v, gpu.supply, strict=True)]
            times = len(members)
            for s, d, step in zip(supply, self.demand, delta, strict=True):
                if step > 0 and s < d:
                    times = min(times, max(1, (d - s) // step))
                elif step < 0 and s > d:
                    times = min(times, max(1, (s - d) // -step))
            for i in members[:times]:
                choice[i] = v
            del members[:times]
            supply[:] = [s + step * times for s, step in zip(supply, delta, strict=True)]

    def result(self, choice: list[Vector | None], exact: bool) -> Reconfiguration:
        changes = []
        supply = self.total(gpu.supply if v is None else v for gpu, v in zip(self.gpus, choice, strict=True))
        for gpu, v in zip(self.gpus, choice, strict=True):
            served = gpu.supply if v is None else v
            serves = {n: c for n, c in zip(self.names, served, strict=True) if c}
            if v is None:
                changes.append(GpuChange(gpu.state.gpu, False, list(gpu.current), [], [], serves))
                continue
            placements, _, _ = gpu.final(v)
            keep = [p for p in placements if p in gpu.current]
            destroy = [p for p in gpu.current if p not in placements]
            create = [p for p in placements if p not in gpu.current]
            changes.append(GpuChange(gpu.state.gpu, True, keep, destroy, create, serves))
        met = {n: min(s, d) for n, s, d in zip(self.names, supply, self.demand, strict=True) if min(s, d)}
        unmet = {n: d - s for n, s, d in zip(self.names, supply, self.demand, strict=True) if d > s}
        touched = sum(c.touched for c in changes)
        return Reconfiguration(self.product.key, changes, met, unmet, touched, exact)


def _plus(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))
