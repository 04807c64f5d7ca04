"""`bench mutation`'s own machinery: the test map, the mutants cosmic-ray makes, the list of equivalent mutants.

The benchmark itself (a pytest process per mutant) is run by `bench smoke` and `make mutation`, not here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from benchmarks import mutation
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
    unmapped = mutation.run_mutation_bench(module="billing/csvsafe.py")
    assert "pass --tests, or map it" in unmapped["error"]
    missing = mutation.run_mutation_bench(module="billing/nothing.py")
    assert "no such Python file" in missing["error"]


@pytest.mark.parametrize("figure", ["kill_rate", "unexplained_survivors", "errors", "mutants"])
def test_the_benchmark_is_registered_with_its_correctness_targets(figure):
    load()
    bench = REGISTRY["mutation"]
    assert figure in {str(t.figure) for t in bench.targets if t.kind == "correctness"}
    assert bench.smoke.args[:2] == ("--module", "billing/services/intervals.py")
