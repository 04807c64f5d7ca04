"""The MIG planners against exhaustive search, the first-fit baseline and their contracts."""

import json
from collections import Counter
from contextlib import contextmanager
from itertools import product as cartesian

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.mig.planner import BIG_DEMAND, BIG_PRODUCT, exhaustive_fewest_gpus, run_mig_planner_bench
from capacity.mig import planner
from capacity.mig.catalog import PRODUCTS
from capacity.mig.layout import Placement, free_placements, free_score, validate_layout
from capacity.mig.planner import GpuState, first_fit, plan_fewest_gpus, plan_onto_gpus

H100 = "H100-80GB"


def assert_plan_meets_exactly(plan, demand):
    counts = Counter(p.profile for layout in plan.layouts for p in layout)
    assert counts == Counter({k: v for k, v in demand.items() if v})
    assert plan.gpus == len(plan.layouts)
    for layout in plan.layouts:
        assert layout, "no empty GPUs in a plan"
        again = validate_layout(plan.product, [], fixed=[(p.profile, p.start) for p in layout])
        assert again.valid, again.reason


# --- fewest GPUs ----------------------------------------------------------------------------------


def test_demand_from_the_brief():
    plan = plan_fewest_gpus(H100, {"3g.40gb": 5, "1g.10gb": 9})
    assert plan.gpus == 4 and plan.optimal and plan.unmet == {}
    assert_plan_meets_exactly(plan, {"3g.40gb": 5, "1g.10gb": 9})


def test_plan_uses_4g_beside_3g():
    plan = plan_fewest_gpus(H100, {"4g.40gb": 3, "3g.40gb": 3})
    assert plan.gpus == 3
    assert all([(p.profile, p.start) for p in layout] == [("4g.40gb", 0), ("3g.40gb", 4)] for layout in plan.layouts)


def test_empty_demand_needs_no_gpus():
    assert plan_fewest_gpus(H100, {}).gpus == 0
    assert plan_fewest_gpus(H100, {"3g.40gb": 0}).layouts == []


def test_bad_demand_is_refused():
    with pytest.raises(ValueError, match="no MIG profile '3g.20gb'"):
        plan_fewest_gpus(H100, {"3g.20gb": 1})
    with pytest.raises(ValueError, match="whole number"):
        plan_fewest_gpus(H100, {"3g.40gb": -1})


def test_resource_form_names_are_canonicalised():
    plan = plan_fewest_gpus(H100, {"1g.10gb.me": 2})
    assert plan.gpus == 2
    assert {p.profile for layout in plan.layouts for p in layout} == {"1g.10gb+me"}


def test_plan_to_dict_is_json():
    data = json.loads(json.dumps(plan_fewest_gpus(H100, {"3g.40gb": 2}).to_dict()))
    assert data == {
        "product": H100,
        "gpus": 1,
        "lower_bound": 1,
        "optimal": True,
        "layouts": [[{"profile": "3g.40gb", "start": 0, "size": 4}, {"profile": "3g.40gb", "start": 4, "size": 4}]],
        "unmet": {},
    }


def small_demands():
    return st.sampled_from(sorted(PRODUCTS)).flatmap(
        lambda key: st.tuples(
            st.just(key),
            st.dictionaries(st.sampled_from([p.name for p in PRODUCTS[key].profiles]), st.integers(1, 5), max_size=3),
        )
    )


@settings(max_examples=300, deadline=None)
@given(case=small_demands())
def test_fewest_gpus_equals_exhaustive_search(case):
    key, demand = case
    plan = plan_fewest_gpus(key, demand)
    assert plan.gpus == (exhaustive_fewest_gpus(key, demand) if demand else 0)
    assert plan.optimal
    assert_plan_meets_exactly(plan, demand)


def test_exhaustive_search_knows_the_facts():
    assert exhaustive_fewest_gpus(H100, {"3g.40gb": 2, "1g.10gb": 1}) == 2
    assert exhaustive_fewest_gpus(H100, {"2g.20gb": 3, "1g.10gb": 1}) == 1
    assert exhaustive_fewest_gpus("A30-24GB", {"1g.6gb": 5}) == 2


@settings(max_examples=150, deadline=None)
@given(
    key=st.sampled_from(sorted(PRODUCTS)),
    counts=st.lists(st.integers(0, 60), min_size=7, max_size=7),
)
def test_first_fit_is_never_better(key, counts):
    demand = {p.name: c for p, c in zip(PRODUCTS[key].profiles, counts, strict=False)}  # A30 has 5 profiles
    plan = plan_fewest_gpus(key, demand)
    baseline = first_fit(key, demand)
    assert plan.lower_bound <= plan.gpus <= baseline.gpus
    assert_plan_meets_exactly(plan, demand)
    assert_plan_meets_exactly(baseline, demand)


def test_fleet_scale_demand_is_optimal_and_beats_first_fit():
    plan = plan_fewest_gpus(BIG_PRODUCT, BIG_DEMAND)
    baseline = first_fit(BIG_PRODUCT, BIG_DEMAND)
    assert plan.optimal  # proven by the LP bound
    assert plan.gpus == 1007  # 7 x 1150 memory slices / 8, and only the 3g instances reach slice 7
    assert baseline.gpus == 1068
    assert_plan_meets_exactly(plan, BIG_DEMAND)


def test_benchmark_reports_what_the_lead_wires_in():
    result = run_mig_planner_bench(cases=40, seed=7)
    assert result["cases"] == 40
    assert result["optimal_fraction"] == 1.0
    assert result["planner_gpus"] < result["first_fit_gpus"]
    assert result["first_fit_better_cases"] == 0
    assert {"gpus_1000_plan_s", "planner_gpus", "first_fit_gpus"} <= result.keys()


# --- reshaping existing GPUs ------------------------------------------------------------------------


def test_serving_instances_count_without_touching():
    gpus = [GpuState("a", [("3g.40gb", 0), ("3g.40gb", 4)]), GpuState("b")]
    result = plan_onto_gpus(H100, gpus, {"3g.40gb": 2})
    assert result.touched == 0 and result.unmet == {} and result.met == {"3g.40gb": 2}
    assert all(not c.create and not c.destroy for c in result.changes)


def test_allocated_instances_stay_and_do_not_serve():
    gpus = [GpuState("a", [("3g.40gb", 0), ("3g.40gb", 4)], allocated={0, 4}), GpuState("b")]
    result = plan_onto_gpus(H100, gpus, {"3g.40gb": 2})
    a, b = result.changes
    assert not a.touched and a.keep == validate_layout(H100, ["3g.40gb"] * 2).placements
    assert b.touched and [(p.profile, p.start) for p in b.create] == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert result.touched == 1


def test_touches_the_fewest_gpus():
    # Either GPU could take a 4g: "b" already has its 1g out of the way at slice 6.
    gpus = [
        GpuState("a", [("1g.10gb", 0)], allocated={0}),
        GpuState("b", [("1g.10gb", 6)], allocated={6}),
        GpuState("c"),
    ]
    result = plan_onto_gpus(H100, gpus, {"4g.40gb": 1, "2g.20gb": 1})
    assert result.unmet == {}
    assert result.touched == 1
    (touched,) = [c for c in result.changes if c.touched]
    assert touched.gpu == "b"
    assert [(p.profile, p.start) for p in touched.keep] == [("1g.10gb", 6)]
    assert {(p.profile, p.start) for p in touched.create} == {("4g.40gb", 0), ("2g.20gb", 4)}


def test_idle_instances_are_reused_when_reshaping():
    gpus = [GpuState("a", [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4)])]
    result = plan_onto_gpus(H100, gpus, {"2g.20gb": 2, "1g.10gb": 1})
    (change,) = result.changes
    assert change.touched and result.unmet == {}
    # Two of the idle 2g instances serve as they are; the surplus one goes, and the 1g takes slice 6,
    # where it blocks nothing, leaving the freed 2g start usable.
    assert [(p.profile, p.start) for p in change.keep] == [("2g.20gb", 0), ("2g.20gb", 2)]
    assert [(p.profile, p.start) for p in change.destroy] == [("2g.20gb", 4)]
    assert [(p.profile, p.start) for p in change.create] == [("1g.10gb", 6)]


def test_more_demand_than_gpus_meets_the_most_compute():
    result = plan_onto_gpus(H100, [GpuState("a")], {"7g.80gb": 1, "1g.10gb": 7, "3g.40gb": 1})
    # One GPU serves at most 7 compute slices: a 7g, seven 1g or a 3g with four 1g.
    assert result.touched == 1
    assert sum(PRODUCTS[H100].profile(n).compute_slices * c for n, c in result.met.items()) == 7


def test_unmet_is_reported():
    result = plan_onto_gpus(H100, [GpuState("a", [("7g.80gb", 0)], allocated={0})], {"1g.10gb": 2})
    assert result.unmet == {"1g.10gb": 2} and result.met == {} and result.touched == 0


def test_invalid_current_state_is_refused():
    with pytest.raises(ValueError, match="GPU a: overlapping placements"):
        plan_onto_gpus(H100, [GpuState("a", [("4g.40gb", 0), ("1g.10gb", 1)])], {"1g.10gb": 1})
    with pytest.raises(ValueError, match="GPU a: no instance starts at allocated slice"):
        plan_onto_gpus(H100, [GpuState("a", [("4g.40gb", 0)], allocated={4})], {"1g.10gb": 1})


@contextmanager
def exact_budget(value):
    """Force the heuristic (hypothesis cannot take function-scoped fixtures such as monkeypatch)."""
    saved = planner.EXACT_REWORK_BUDGET
    planner.EXACT_REWORK_BUDGET = value
    try:
        yield
    finally:
        planner.EXACT_REWORK_BUDGET = saved


def random_gpu(draw, key, index):
    """A GPU built the way a real one is: instances created one after another, some allocated."""
    product = PRODUCTS[key]
    placements = []
    for _ in range(draw(st.integers(0, 4))):
        options = free_placements(product, placements)
        if not options:
            break
        placements.append(draw(st.sampled_from(options)))
    allocated = draw(st.sets(st.sampled_from([p.start for p in placements]))) if placements else set()
    return GpuState(f"gpu-{index}", [(p.profile, p.start) for p in placements], allocated)


@st.composite
def fleets(draw):
    key = draw(st.sampled_from([H100, "A30-24GB", "A100-40GB"]))
    gpus = [random_gpu(draw, key, i) for i in range(draw(st.integers(1, 3)))]
    profiles = [p.name for p in PRODUCTS[key].profiles]
    names = draw(st.lists(st.sampled_from(profiles), min_size=1, max_size=2, unique=True))
    demand = {n: draw(st.integers(0, 3)) for n in names}
    return key, gpus, demand


def brute_force_rework(key, gpus, demand):
    """Best (met weight, -touched, free score) over every combination of per-GPU choices."""
    product = PRODUCTS[key]
    names = sorted(demand)
    weights = [product.profile(n).compute_slices for n in names]
    per_gpu = []
    for gpu in gpus:
        current = validate_layout(product, [], fixed=gpu.instances).placements
        pinned = [(p.profile, p.start) for p in current if p.start in gpu.allocated]
        supply = tuple(sum(p.profile == n and p.start not in gpu.allocated for p in current) for n in names)
        options = [(supply, 0, free_score(product, current))]
        for v in cartesian(*(range(demand[n] + 1) for n in names)):
            scores = all_scores(product, pinned, [n for n, c in zip(names, v, strict=True) for _ in range(c)])
            if scores:
                options.append((v, 1, max(scores)))
        per_gpu.append(options)
    best = None
    for combo in cartesian(*per_gpu):
        supply = [sum(col) for col in zip(*(o[0] for o in combo), strict=True)]
        met = sum(w * min(s, demand[n]) for w, s, n in zip(weights, supply, names, strict=True))
        key_ = (met, -sum(o[1] for o in combo), sum(o[2][0] for o in combo), sum(o[2][1] for o in combo))
        best = key_ if best is None or key_ > best else best
    return best


def all_scores(product, pinned, wanted):
    """free_score of every valid arrangement of `wanted` beside `pinned` (brute force over starts)."""
    profiles = [product.profile(n) for n in wanted]
    fixed = [Placement(n, s, product.profile(n).memory_slices) for n, s in pinned]
    scores = []
    for chosen in cartesian(*(p.starts for p in profiles)):
        layout = fixed + [Placement(p.name, s, p.memory_slices) for p, s in zip(profiles, chosen, strict=True)]
        if validate_layout(product, [], fixed=[(p.profile, p.start) for p in layout]).valid:
            scores.append(free_score(product, layout))
    return scores


def objective(result, key, demand):
    product = PRODUCTS[key]
    met = sum(product.profile(n).compute_slices * c for n, c in result.met.items())
    scores = [free_score(product, c.keep + c.create) for c in result.changes]
    return (met, -result.touched, sum(s[0] for s in scores), sum(s[1] for s in scores))


def assert_reconfiguration_is_sound(result, key, gpus, demand):
    for gpu, change in zip(gpus, result.changes, strict=True):
        assert change.gpu == gpu.gpu
        final = change.keep + change.create
        assert validate_layout(key, [], fixed=[(p.profile, p.start) for p in final]).valid
        kept = {(p.profile, p.start) for p in change.keep}
        allocated = {(n, s) for n, s in gpu.instances if s in gpu.allocated}
        assert allocated <= kept, "allocated instances never move"
        assert kept | {(p.profile, p.start) for p in change.destroy} == set(gpu.instances)
        assert change.touched == bool(change.create or change.destroy)
    served = Counter()
    for change in result.changes:
        served.update(change.serves)
    for name, count in demand.items():
        assert result.met.get(name, 0) == min(served[name], count)
        assert result.unmet.get(name, 0) == count - result.met.get(name, 0)
    assert result.touched == sum(c.touched for c in result.changes)


@settings(max_examples=120, deadline=None)
@given(case=fleets())
def test_plan_onto_gpus_equals_brute_force(case):
    key, gpus, demand = case
    result = plan_onto_gpus(key, gpus, demand)
    assert result.exact
    assert_reconfiguration_is_sound(result, key, gpus, demand)
    assert objective(result, key, demand) == brute_force_rework(key, gpus, demand)


@settings(max_examples=60, deadline=None)
@given(case=fleets())
def test_heuristic_is_sound_on_small_fleets(case):
    key, gpus, demand = case
    exact = plan_onto_gpus(key, gpus, demand)
    with exact_budget(0):
        result = plan_onto_gpus(key, gpus, demand)
    assert not result.exact
    assert_reconfiguration_is_sound(result, key, gpus, demand)
    assert objective(result, key, demand)[0] <= objective(exact, key, demand)[0]


def test_heuristic_on_a_fleet_touches_as_few_gpus_as_the_fewest_gpus_plan():
    demand = {"3g.40gb": 300, "2g.20gb": 300, "1g.10gb": 300}
    busy = [GpuState(f"busy-{i}", [("3g.40gb", 0), ("3g.40gb", 4)], allocated={0, 4}) for i in range(100)]
    idle = [GpuState(f"idle-{i}", [("7g.80gb", 0)]) for i in range(100)]
    empty = [GpuState(f"empty-{i}") for i in range(300)]
    result = plan_onto_gpus(H100, busy + idle + empty, demand)
    assert not result.exact
    assert result.unmet == {}
    assert result.touched == plan_fewest_gpus(H100, demand).gpus == 263
    assert not any(c.touched for c in result.changes[:200]), "busy and idle GPUs are left alone"
    assert_reconfiguration_is_sound(result, H100, busy + idle + empty, demand)


def test_heuristic_fills_partly_used_gpus_when_nothing_else_is_free():
    gpus = [GpuState(f"g{i}", [("3g.40gb", 4)], allocated={4}) for i in range(400)]
    result = plan_onto_gpus(H100, gpus, {"2g.20gb": 300, "1g.10gb": 500})
    assert not result.exact
    assert result.unmet == {}
    # Four free slices per GPU and 300 x 2 + 500 x 1 slices wanted: 275 GPUs at best.
    assert result.touched == 275
    assert_reconfiguration_is_sound(result, H100, gpus, {"2g.20gb": 300, "1g.10gb": 500})
