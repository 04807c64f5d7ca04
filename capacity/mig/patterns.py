"""The pattern space of one product: the count vectors of demanded profiles that fit on one GPU, its LP and
the exact search over it (capacity.mig.planner's fewest-GPUs plans and reworks read it)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache

from .catalog import Product, get_product
from .layout import Placement, maximal_layouts, valid_layouts, validate_layout

# Safety valve for the exact search (memoised nodes); small cases finish far below it.
EXACT_NODE_BUDGET = 200_000


Vector = tuple[int, ...]


class _Exhausted(Exception):
    """The exact search hit EXACT_NODE_BUDGET."""


class _Space:
    """The patterns of one product over one ordered set of demanded profiles."""

    def __init__(self, product: Product, names: tuple[str, ...]) -> None:
        self.product = product
        self.names = names
        self.profiles = [product.profile(n) for n in names]
        index = {n: i for i, n in enumerate(names)}
        projected = set()
        for layout in maximal_layouts(product.key):
            v = [0] * len(names)
            for n in layout:
                if n in index:
                    v[index[n]] += 1
            projected.add(tuple(v))
        self.patterns = sorted(_maximal(projected - {(0,) * len(names)}), key=self.weight, reverse=True)
        # Single-profile patterns give the simplex a feasible starting basis without a phase 1.
        self.pure = []
        for i, n in enumerate(names):
            alone = max(layout.count(n) for layout in valid_layouts(product.key) if set(layout) == {n})
            self.pure.append(tuple(alone if j == i else 0 for j in range(len(names))))

    def weight(self, v: Vector) -> tuple[int, Vector]:
        return sum(p.compute_slices * c for p, c in zip(self.profiles, v, strict=True)), v

    def bound(self, r: Vector) -> int:
        """A cheap lower bound on the GPUs needed for r: compute, memory, instances, per-profile caps, +me."""
        product, profiles = self.product, self.profiles
        compute = sum(p.compute_slices * c for p, c in zip(profiles, r, strict=True))
        memory = sum(p.memory_slices * c for p, c in zip(profiles, r, strict=True))
        media = sum(c for p, c in zip(profiles, r, strict=True) if p.has_media_extensions)
        per_profile = max(-(-c // alone[i]) for i, (c, alone) in enumerate(zip(r, self.pure, strict=True)))
        return max(
            -(-compute // product.compute_slices),
            -(-memory // product.memory_slices),
            -(-sum(r) // product.max_gpu_instances),
            per_profile,
            media,
        )

    def lp(self, target: Vector) -> tuple[Fraction, list[tuple[Vector, Fraction]]]:
        """Solve min sum(x) s.t. sum(x_p * p) >= target, x >= 0 over all patterns (primal simplex, Bland's rule)."""
        k = len(target)
        columns = self.pure + [p for p in self.patterns if p not in self.pure]
        n = len(columns)
        # Tableau rows: B^-1 [A | -I | target] with B = diag(pure counts); costs 1 on patterns, 0 on surplus.
        rows = []
        for i in range(k):
            scale = Fraction(1, self.pure[i][i])
            row = [scale * c[i] for c in columns] + [-scale if j == i else Fraction(0) for j in range(k)]
            rows.append(row + [scale * target[i]])
        basis = list(range(k))
        costs = [Fraction(1)] * n + [Fraction(0)] * k
        while True:
            reduced = [costs[j] - sum(costs[basis[i]] * rows[i][j] for i in range(k)) for j in range(n + k)]
            entering = next((j for j, c in enumerate(reduced) if c < 0), None)
            if entering is None:
                break
            ratios = [(rows[i][-1] / rows[i][entering], basis[i], i) for i in range(k) if rows[i][entering] > 0]
            _, _, pivot = min(ratios)
            factor = rows[pivot][entering]
            rows[pivot] = [a / factor for a in rows[pivot]]
            for i in range(k):
                if i != pivot and rows[i][entering]:
                    f = rows[i][entering]
                    rows[i] = [a - f * b for a, b in zip(rows[i], rows[pivot], strict=True)]
            basis[pivot] = entering
        solution = [(columns[b], rows[i][-1]) for i, b in enumerate(basis) if b < n and rows[i][-1] > 0]
        return sum((x for _, x in solution), Fraction(0)), solution

    def rounded(self, target: Vector, columns: list[tuple[Vector, Fraction]]) -> list[Vector]:
        """Whole copies of the LP's patterns, then the leftover demand solved exactly.

        The leftover is covered by one copy of each fractional column, so the tail is at most as many
        GPUs as there are demanded profiles (basic columns), and usually fewer.
        """
        vectors = [p for p, x in columns for _ in range(math.floor(x))]
        rest = tuple(max(t - sum(v[i] for v in vectors), 0) for i, t in enumerate(target))
        fallback = [p for p, x in columns if x != math.floor(x)]
        tail = self.exact(rest, len(fallback))[0] if any(rest) else []
        return vectors + (fallback if tail is None else tail)

    def exact(self, target: Vector, limit: int) -> tuple[list[Vector] | None, bool]:
        """The fewest trimmed patterns covering target if that is at most `limit` (else None), and
        whether the search completed (False when it ran out of EXACT_NODE_BUDGET).

        Any GPU of an optimal cover can be widened to a maximal pattern cut down to what is still
        needed, and some GPU covers the largest profile still needed, so only those are branched on.
        """
        failed: dict[Vector, int] = {}
        nodes = 0

        def cover(r: Vector, n: int) -> list[Vector] | None:
            nonlocal nodes
            if not any(r):
                return []
            if n < self.bound(r) or failed.get(r, -1) >= n:
                return None
            nodes += 1
            if nodes > EXACT_NODE_BUDGET:
                raise _Exhausted
            for p in self.candidates(r):
                sub = cover(tuple(a - b for a, b in zip(r, p, strict=True)), n - 1)
                if sub is not None:
                    return [p, *sub]
            failed[r] = n
            return None

        try:
            for n in range(self.bound(target), limit + 1):
                found = cover(target, n)
                if found is not None:
                    return found, True
        except _Exhausted:
            return None, False
        return None, True

    def candidates(self, r: Vector) -> list[Vector]:
        first = next(i for i, c in enumerate(r) if c)
        trimmed = {tuple(min(a, b) for a, b in zip(p, r, strict=True)) for p in self.patterns if p[first]}
        return sorted(_maximal(trimmed), key=self.weight, reverse=True)

    def layout(self, v: Vector) -> list[Placement]:
        names = [n for n, c in zip(self.names, v, strict=True) for _ in range(c)]
        return validate_layout(self.product, names).placements


@lru_cache(maxsize=256)
def pattern_space(product_key: str, names: tuple[str, ...]) -> _Space:
    return _Space(get_product(product_key), names)


def _maximal(vectors: Iterable[Vector]) -> list[Vector]:
    vectors = sorted(set(vectors), key=sum, reverse=True)
    kept: list[Vector] = []
    for v in vectors:
        if not any(all(a >= b for a, b in zip(w, v, strict=True)) for w in kept):
            kept.append(v)
    return kept


# Reconfiguring GPUs that exist -----------------------------------------------------------------
