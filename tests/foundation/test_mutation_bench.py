"""`bench mutation`'s own machinery: the test map, the mutants cosmic-ray makes, the list of equivalent mutants.

The benchmark itself (a pytest process per mutant) is run by `bench smoke` and `make mutation`, not here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from benchmarks import mutation
from benchmarks.mutation import selection as mutation_select
from benchmarks.registry import REGISTRY, load

SOURCE = """def overlap(a0, a1, b0, b1):
    start, end = max(a0, b0), min(a1, b1)
    return end - start if end > start else 0
"""


def test_every_mapped_module_and_test_file_exists():
    for module, tests in mutation.TESTS_FOR.items():
        assert (settings.BASE_DIR / module).is_file(), module
        assert tests, module
        for test in tests:
            assert (settings.BASE_DIR / test).is_file(), f"{module}: {test}"


def test_make_mutation_runs_only_mapped_modules():
    """The Makefile names MUTATION_MODULES by path: one that moved (billing/rates.py to pricing/) fails here."""
    text = (settings.BASE_DIR / "Makefile").read_text()
    listed = text.split("MUTATION_MODULES ?=", 1)[1].split("\nMUTATION_SAMPLE", 1)[0].replace("\\\n", " ").split()
    assert "pricing/rates.py" in listed
    assert [module for module in listed if module not in mutation.TESTS_FOR] == []


def test_mutants_are_one_change_each_in_a_fixed_order_without_the_type_error_operators():
    mutants = mutation.mutants_of(SOURCE)

    assert mutants == mutation.mutants_of(SOURCE)  # the same draw for the same seed, run after run
    assert len({m.code for m in mutants}) == len(mutants)  # no duplicates, none equal to the source
    assert SOURCE not in {m.code for m in mutants}
    names = {m.operator for m in mutants}
    assert "ReplaceComparisonOperator_Gt_GtE" in names
    assert "ReplaceBinaryOperator_Sub_Add" in names
    assert not {n for n in names if mutation.LEFT_OUT.search(n)}  # bitwise, shift and power replacements
    sub_add = next(m for m in mutants if m.operator == "ReplaceBinaryOperator_Sub_Add")
    assert (sub_add.line, sub_add.before, sub_add.after) == (
        3,
        "return end - start if end > start else 0",
        "return end + start if end > start else 0",
    )
    assert sub_add.where("x/y.py") == "x/y.py:3"
    assert sub_add.change == "return end - start if end > start else 0 -> return end + start if end > start else 0"


def test_mutants_of_annotations_only_or_that_are_not_python_are_left_out():
    source = (
        "from __future__ import annotations\n\n\n"
        "def later(value: int | None, *, step: int = 1) -> int | None:\n"
        "    return None if value is None else value + step\n"
    )
    mutants = mutation.mutants_of(source)

    # in the signature only the default changes: not `int + None`, `def f(a, +, b)` or `def f(a, /, b)`
    assert {(m.line, m.operator) for m in mutants if m.line != 5} == {(4, "NumberReplacer")}
    assert {"ReplaceBinaryOperator_Add_Sub", "ReplaceComparisonOperator_Is_IsNot"} <= {m.operator for m in mutants}
    # a keyword-only parameter without a default, the `*` made `/`: still the same parameters, left out too
    required = "def charge(statement, *, amount, actor=None):\n    return statement, amount, actor\n"
    assert mutation.mutants_of(required) == []


def test_equivalent_mutants_are_read_from_the_modules_test_folder(monkeypatch, tmp_path):
    (tmp_path / "tests" / "billing").mkdir(parents=True)
    (tmp_path / "tests" / "billing" / "EQUIVALENT_MUTANTS.md").write_text(
        "| where | operator | change | reason |\n"
        "|---|---|---|---|\n"
        "| `billing/periods.py:12` | `ReplaceComparisonOperator_Lt_LtE` | `a < b` -> `a <= b` | a == b is empty |\n"
        "| billing/other.py:3 | NumberReplacer | `1` -> `2` | another module |\n"
    )
    monkeypatch.setattr(settings, "BASE_DIR", Path(tmp_path))

    assert mutation.equivalents("billing/periods.py") == {
        ("billing/periods.py:12", "ReplaceComparisonOperator_Lt_LtE"): "a == b is empty"
    }
    assert mutation.equivalents("capacity/mig/planner.py") == {}  # no list: every survivor is unexplained


def test_an_unmapped_module_or_a_missing_file_is_an_error_naming_what_to_do():
    unmapped = mutation.run_mutation_bench(module="billing/exports/csvsafe.py")
    assert "pass --tests, or map it" in unmapped["error"]
    missing = mutation.run_mutation_bench(module="billing/nothing.py")
    assert "no such Python file" in missing["error"]


@pytest.mark.parametrize("figure", ["kill_rate", "unexplained_survivors", "errors", "mutants"])
def test_the_benchmark_is_registered_with_its_correctness_targets(figure):
    load()
    bench = REGISTRY["mutation"]
    assert figure in {str(t.figure) for t in bench.targets if t.kind == "correctness"}
    assert bench.smoke.args[:2] == ("--module", "billing/services/intervals.py")


# Coverage-guided selection (benchmarks/mutation/selection.py): a tiny fake module and its tests, run for real.
FAKE_MODULE = """import functools

STEP = 1


def overlap(a0, a1, b0, b1):
    start, end = max(a0, b0), min(a1, b1)
    if end > start:
        return (end
                - start)
    return 0


def label(n):
    @functools.lru_cache(maxsize=STEP + 1)
    def cached(m):
        return f"#{m}"

    return cached(n)


def never_called(x):
    return x * 2


@functools.lru_cache
def square(n):
    return n * n
"""
FAKE_TESTS = """from fake_overlap import label, overlap, square


def test_overlapping():
    assert overlap(0, 10, 5, 20) == 5


def test_apart():
    assert overlap(0, 1, 5, 6) == 0


def test_label():
    assert label(3) == "#3"


def test_square():
    assert square(4) == 16


def test_square_again():  # reads the answer test_square cached, unless the cache is emptied between tests
    assert square(4) == 16
"""


def test_a_change_inside_a_function_reaches_its_innermost_statement_and_import_time_code_reaches_every_test():
    reached = mutation_select.lines_reached
    assert reached(FAKE_MODULE, 3) is None  # STEP: module level, runs at import
    assert reached(FAKE_MODULE, 6) is None  # the def line (defaults, decorators) runs at import too
    assert reached(FAKE_MODULE, 7) == range(7, 8)
    assert reached(FAKE_MODULE, 10) == range(9, 11)  # a continuation line: the whole `return (end / - start)`
    assert reached(FAKE_MODULE, 8) == range(8, 11)  # the `if` header: the if and its body
    assert reached(FAKE_MODULE, 15) == range(15, 18)  # a nested def's decorator runs when label() runs
    assert reached(FAKE_MODULE, 2) is None  # a blank line holds no statement
    assert reached(FAKE_MODULE, 23) == range(23, 24)


def _fake_project(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "fake_overlap.py").write_text(FAKE_MODULE)
    (tmp_path / "test_fake.py").write_text(FAKE_TESTS)
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(settings.BASE_DIR)])
    # No bytecode: a pyc records its source's mtime in whole seconds and its size, so a same-size mutant written
    # within the second of the original would run the original's cached code (as the benchmark's mutant runs do).
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _pytest(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.mutation.db"]
    return subprocess.run(
        [*command, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_coverage_map_names_the_tests_that_ran_each_line_and_a_mutant_runs_only_those(tmp_path):
    env = _fake_project(tmp_path)
    data, source = tmp_path / "cov", tmp_path / "fake_overlap.py"
    measured = _pytest(tmp_path, {**env, "GPUAAS_MUTATION_COVER": f"{data}|{source}"}, "test_fake.py")
    assert measured.returncode == 0, measured.stdout + measured.stderr

    order = Path(f"{data}.order").read_text().splitlines()
    names = ("overlapping", "apart", "label", "square", "square_again")
    assert order == [f"test_fake.py::test_{name}" for name in names]
    cover = mutation_select.CoverageMap.read(data, source, order)
    assert sorted(cover.seconds) == sorted(order)  # each test's own seconds, for its mutants' timeouts
    assert all(s >= 0 for s in cover.seconds.values())
    assert cover.seconds_for(order[:2]) == cover.seconds[order[0]] + cover.seconds[order[1]]
    reached = mutation_select.lines_reached
    assert cover.tests_for(reached(FAKE_MODULE, 9)) == ["test_fake.py::test_overlapping"]
    assert cover.tests_for(reached(FAKE_MODULE, 11)) == ["test_fake.py::test_apart"]
    assert cover.tests_for(reached(FAKE_MODULE, 7)) == order[:2]
    assert cover.tests_for(reached(FAKE_MODULE, 15)) == ["test_fake.py::test_label"]
    assert cover.tests_for(reached(FAKE_MODULE, 3)) == order  # import time: every test
    assert cover.tests_for(reached(FAKE_MODULE, 23)) == []  # never run: a survivor without a run (not_covered)
    assert cover.tests_for(reached(FAKE_MODULE, 28)) == order[3:]  # the module's caches are emptied per test

    # `- start` made `+ start`: the one selected test kills it, and the deselected ones are not run at all
    (tmp_path / "fake_overlap.py").write_text(FAKE_MODULE.replace("- start", "+ start"))
    selected = cover.tests_for(reached(FAKE_MODULE, 10))
    (tmp_path / "select.txt").write_text("\n".join(selected))
    killed = _pytest(tmp_path, {**env, "GPUAAS_MUTATION_SELECT": str(tmp_path / "select.txt")}, "test_fake.py")
    assert killed.returncode == 1
    assert "1 failed, 4 deselected" in killed.stdout
    (tmp_path / "select.txt").write_text("test_fake.py::test_apart")  # a test that never runs the line: survives
    survived = _pytest(tmp_path, {**env, "GPUAAS_MUTATION_SELECT": str(tmp_path / "select.txt")}, "test_fake.py")
    assert survived.returncode == 0
    assert "1 passed, 4 deselected" in survived.stdout


def test_a_mutants_timeout_is_sized_from_its_own_tests_not_the_whole_mapped_list():
    order = ["t.py::a", "t.py::b", "t.py::c"]
    cover = mutation_select.CoverageMap({}, order, {"t.py::a": 40.0, "t.py::b": 2.0, "t.py::c": 8.0})
    timeout = mutation.mutant_timeout
    # baseline 60 s: 50 s of tests and 10 s of start-up
    assert timeout(60.0, cover, ["t.py::a"]) == 3 * (10 + 40)
    assert timeout(60.0, cover, ["t.py::a", "t.py::c"]) == 3 * (10 + 48)
    assert timeout(60.0, cover, ["t.py::b"]) == 60.0  # 3 x 12 s is under the one-minute floor
    assert timeout(60.0, cover, order) == 180.0  # every test: 3 x the baseline
    assert timeout(60.0, cover, None) == 180.0  # import-time code runs every test
    assert timeout(60.0, None, ["t.py::a"]) == 180.0  # --selection all: no coverage map
    assert timeout(60.0, mutation_select.CoverageMap({}, order), ["t.py::a"]) == 180.0  # no timings recorded
    assert timeout(10.0, None, None) == 60.0  # a quick list still gets the floor
    slower = mutation_select.CoverageMap({}, order, {"t.py::a": 70.0})  # timings above the baseline: capped
    assert timeout(60.0, slower, ["t.py::a"]) == 180.0


def test_the_selected_files_are_given_to_pytest_once_each_in_order():
    ids = ["tests/b.py::test_1", "tests/a.py::test_2[x-1]", "tests/b.py::K::test_3"]
    assert mutation_select.files_of(ids) == ["tests/b.py", "tests/a.py"]


def test_an_unknown_selection_is_an_error_naming_the_choices():
    out = mutation.run_mutation_bench(module="billing/periods.py", selection="some")
    assert out["error"] == "--selection some: use one of coverage, all"


def test_further_seeds_share_one_run_and_each_seed_is_scored_on_its_own_draw():
    draws = {seed: mutation._draw(50, 5, seed) for seed in (8, 1)}
    assert draws[8] == mutation._draw(50, 5, 8) and len(draws[8]) == 5  # a fixed seed draws the same mutants
    assert mutation._draw(3, 5, 8) == mutation._draw(3, 0, 1) == {0, 1, 2}  # a sample over the population: all
    row = {"where": "m.py:3", "operator": "NumberReplacer", "change": "1 -> 2", "tests_run": 2, "not_covered": False}
    results = [
        ("failed", {**row, "exit": 1}),
        ("timeout", {**row, "exit": None}),
        ("passed", {**row, "where": "m.py:4", "exit": 0}),
        ("not_covered", {**row, "where": "m.py:5", "tests_run": 0, "not_covered": True, "exit": None}),
    ]
    tally = mutation._tally(results, {("m.py:4", "NumberReplacer"): "never read"})
    assert (tally["mutants"], tally["killed"], tally["kill_rate"], tally["timeouts"]) == (4, 2, 0.5, 1)
    assert (tally["equivalent"], tally["unexplained_survivors"]) == (1, 1)
    assert [(s["where"], s["equivalent"], s["not_covered"]) for s in tally["survivors"]] == [
        ("m.py:4", "never read", False),
        ("m.py:5", None, True),
    ]


# The two runners (benchmarks/mutation/sandbox.py): a forked child of the warm parent and a pytest process of its own
# must give every mutant the same outcome.
@pytest.fixture
def fake_copy(tmp_path, monkeypatch):
    from benchmarks.mutation.sandbox import Copy

    root = tmp_path / "project"
    root.mkdir()
    (root / "fake_overlap.py").write_text(FAKE_MODULE)
    (root / "test_fake.py").write_text(FAKE_TESTS)
    (root / "benchmarks").symlink_to(settings.BASE_DIR / "benchmarks")  # the plugin and the warm parent's script
    copy = Copy(root)
    copy.var.mkdir()
    copy.template.write_bytes(b"")  # no Django here: no test database for the plugin to point at
    with_django = copy.env
    copy.env = lambda **kw: {k: v for k, v in with_django(**kw).items() if k != "GPUAAS_MUTATION_TEST_DB"}
    for name in ("DJANGO_SETTINGS_MODULE", "PYTEST_ADDOPTS", "PYTHONPATH"):
        monkeypatch.delenv(name, raising=False)
    yield copy
    copy.stop_fork()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork runner needs os.fork")
def test_the_fork_runner_classifies_killed_surviving_and_timed_out_mutants_as_the_subprocess_runner_does(fake_copy):
    copy, module = fake_copy, fake_copy.root / "fake_overlap.py"
    kill = ["test_fake.py::test_overlapping"]  # runs `- start`
    miss = ["test_fake.py::test_apart"]  # never runs it
    outcomes = {}
    for runner in ("subprocess", "fork"):
        if runner == "fork":
            copy.start_fork()
            assert copy.fork.started["held"] > 0  # pytest, hypothesis, django ... imported once, in the parent
        module.write_text(FAKE_MODULE)
        unmutated = copy.pytest(["test_fake.py"], 120, modules=copy.var / "modules.txt")
        module.write_text(FAKE_MODULE.replace("- start", "+ start"))
        killed = copy.pytest(["test_fake.py"], 120, select=kill)
        assert "assert 15 == 5" in copy.last_output  # the mutant's own answer: the child imported it fresh
        survived = copy.pytest(["test_fake.py"], 120, select=miss)
        assert "1 passed, 4 deselected" in copy.last_output
        module.write_text(FAKE_MODULE.replace("return 0", "while True:\n        pass"))
        timed_out = copy.pytest(["test_fake.py"], 5, select=miss)
        outcomes[runner] = (unmutated, killed, survived, timed_out)

    assert outcomes["fork"] == outcomes["subprocess"]
    assert outcomes["fork"] == (("passed", 0), ("failed", 1), ("passed", 0), ("timeout", None))
    names = (copy.var / "modules.txt").read_text().split()
    assert "pytest" in names and "fake_overlap" not in names and "test_fake" not in names  # outside modules only
    assert copy.fork.hold(copy.var / "modules.txt")["failed"] == 0


def test_an_unknown_runner_is_an_error_naming_the_choices():
    out = mutation.run_mutation_bench(module="billing/periods.py", runner="thread")
    assert out["error"] == "--runner thread: use one of fork, subprocess"


def test_mutants_tests_run_under_the_suites_settings_not_the_callers(monkeypatch, tmp_path):
    """manage.py exports gpuaas.settings and pytest-django prefers the environment to pyproject's settings, so
    the copy's environment must not carry it, or every mutant runs its tests under production settings."""
    from benchmarks.mutation.sandbox import Copy

    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "gpuaas.settings")
    monkeypatch.setenv("DATABASE_URL", "postgres://elsewhere/db")
    env = Copy(tmp_path).env(write_bytecode=False)
    assert "DJANGO_SETTINGS_MODULE" not in env and "DATABASE_URL" not in env
