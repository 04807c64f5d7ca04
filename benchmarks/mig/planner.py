"""Benchmark of the MIG planner: optimality on small cases, speed and quality at fleet scale.

`python manage.py bench mig-planner` runs run_mig_planner_bench(). The exhaustive search here shares
nothing with the planner but the catalog: it places instances slice by slice to decide what fits and
tries every split of the demand, so agreement is real evidence.
"""

from __future__ import annotations

import random
import time
from functools import cache
from itertools import product as cartesian

from capacity.mig.catalog import PRODUCTS, Product, get_product
from capacity.mig.planner import clear_caches, first_fit, plan_fewest_gpus

from ..registry import Smoke, arg, benchmark
from ..targets import correctness, performance

# A mix where first-fit visibly wastes GPUs: it pairs the 3g instances (6 of 7 compute slices) and
# strands slice 7 on the 2g/1g GPUs, while the best plan puts a 3g at slice 4 beside 2g/1g instances.
BIG_PRODUCT = "H100-80GB"
BIG_DEMAND = {"3g.40gb": 1150, "2g.20gb": 1150, "1g.10gb": 1150}


def run_mig_planner_bench(cases: int = 500, seed: int = 20240607) -> dict:
    """Compare plan_fewest_gpus with exhaustive search on random small cases, then time a fleet-size plan."""
    rng = random.Random(seed)
    keys = sorted(PRODUCTS)
    matches = 0
    mismatches = []
    first_fit_worse = first_fit_better = 0
    for _ in range(cases):
        product = PRODUCTS[rng.choice(keys)]
        names = rng.sample([p.name for p in product.profiles], rng.randint(1, 3))
        demand = {n: rng.randint(1, 5) for n in names}
        planned = plan_fewest_gpus(product, demand).gpus
        best = exhaustive_fewest_gpus(product, demand)
        baseline = first_fit(product, demand).gpus
        first_fit_worse += baseline > planned
        first_fit_better += baseline < planned
        if planned == best:
            matches += 1
        elif len(mismatches) < 5:
            mismatches.append({"product": product.key, "demand": demand, "planner": planned, "exhaustive": best})

    clear_caches()  # time a cold start, layout enumeration included
    started = time.perf_counter()
    plan = plan_fewest_gpus(BIG_PRODUCT, BIG_DEMAND)
    elapsed = time.perf_counter() - started
    baseline = first_fit(BIG_PRODUCT, BIG_DEMAND)
    return {
        "cases": cases,
        "optimal_fraction": matches / cases if cases else 1.0,
        "mismatches": mismatches,
        "first_fit_worse_fraction": first_fit_worse / cases if cases else 0.0,
        "first_fit_better_cases": first_fit_better,
        "big_product": BIG_PRODUCT,
        "big_demand": dict(BIG_DEMAND),
        "gpus_1000_plan_s": round(elapsed, 4),
        "planner_gpus": plan.gpus,
        "planner_lower_bound": plan.lower_bound,
        "first_fit_gpus": baseline.gpus,
    }


def exhaustive_fewest_gpus(product: Product | str, demand: dict[str, int]) -> int:
    """The fewest GPUs for `demand`, by trying every split of it into single-GPU layouts."""
    product = product if isinstance(product, Product) else get_product(product)
    names = tuple(sorted(demand))
    target = tuple(demand[n] for n in names)
    fitting = [
        v
        for v in cartesian(*(range(c + 1) for c in target))
        if any(v) and _fits(product.key, tuple(n for n, c in zip(names, v, strict=True) for _ in range(c)))
    ]

    @cache
    def fewest(rest: tuple[int, ...]) -> int:
        if not any(rest):
            return 0
        return 1 + min(
            fewest(tuple(a - b for a, b in zip(rest, v, strict=True)))
            for v in fitting
            if all(b <= a for a, b in zip(rest, v, strict=True))
        )

    return fewest(target)


@cache
def _fits(product_key: str, names: tuple[str, ...]) -> bool:
    """Whether these instances fit on one empty GPU, by trying every start for every instance."""
    product = get_product(product_key)
    profiles = [product.profile(n) for n in names]
    if (
        len(profiles) > product.max_gpu_instances
        or sum(p.compute_slices for p in profiles) > product.compute_slices
        or sum(p.has_media_extensions for p in profiles) > 1
        or any(names.count(p.name) > p.max_instances for p in profiles)
    ):
        return False

    def place(i: int, used: frozenset[int]) -> bool:
        if i == len(profiles):
            return True
        p = profiles[i]
        for start in p.starts:
            slices = frozenset(range(start, start + p.memory_slices))
            if not used & slices and place(i + 1, used | slices):
                return True
        return False

    return place(0, frozenset())


@benchmark(
    "mig-planner",
    help="Planner vs exhaustive search on random small cases, and a ~1,000-GPU mixed demand vs first-fit.",
    arguments=[arg("--cases", type=int, default=500), arg("--seed", type=int, default=20240607)],
    targets=[
        correctness("optimal_fraction", "==", 1.0),
        correctness("planner_gpus", "==", "planner_lower_bound"),
        correctness("planner_gpus", "<", "first_fit_gpus"),
        performance("gpus_1000_plan_s", "<=", 1),
    ],
    smoke=Smoke(("--cases", "40")),
)
def bench_mig_planner(*, cases: int, seed: int, stdout=None, **_) -> dict:
    return run_mig_planner_bench(cases=cases, seed=seed)
