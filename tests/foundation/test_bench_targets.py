"""The targets block every `bench NAME` prints (benchmarks/targets.py) and what each benchmark declares."""

import io
import json
import os

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from benchmarks.registry import REGISTRY, Benchmark, Smoke, load
from benchmarks.smoke import missing_services, run_one
from benchmarks.targets import CORRECTNESS, Expr, block, correctness, performance, unmet
from gpuaas.management.commands.bench import Command

APPROVALS = [
    correctness("approved", "==", "units"),
    correctness("double_allocated", "==", 0),
    performance("p99_ms", "<=", 100),
]


def test_met_targets_give_their_values_and_bounds():
    checked = block({"approved": 100, "units": 100, "double_allocated": 0, "p99_ms": 40.5}, APPROVALS)
    assert checked == {
        "targets": {
            "approved == units": {"value": 100, "target": 100, "met": True, "kind": "correctness"},
            "double_allocated == 0": {"value": 0, "target": 0, "met": True, "kind": "correctness"},
            "p99_ms <= 100": {"value": 40.5, "target": 100, "met": True, "kind": "performance"},
        },
        "correctness_met": True,
        "targets_met": True,
    }


def test_a_missed_correctness_target_fails_both_flags_and_is_named():
    checked = block({"approved": 0, "units": 100, "double_allocated": 0, "p99_ms": 40.5}, APPROVALS)
    assert checked["targets"]["approved == units"] == {"value": 0, "target": 100, "met": False, "kind": "correctness"}
    assert (checked["correctness_met"], checked["targets_met"]) == (False, False)
    assert unmet(checked) == ["approved == units (value 0, target 100)"]


def test_a_missed_timing_leaves_correctness_met():
    checked = block({"approved": 100, "units": 100, "double_allocated": 0, "p99_ms": 100.1}, APPROVALS)
    assert (checked["correctness_met"], checked["targets_met"]) == (True, False)
    assert unmet(checked) == [] and unmet(checked, "performance") == ["p99_ms <= 100 (value 100.1, target 100)"]


def test_a_figure_the_result_lacks_is_a_miss_not_a_pass():
    checked = block({"error": "needs PostgreSQL"}, APPROVALS)
    assert checked["targets"]["double_allocated == 0"] == {
        "value": None,
        "target": 0,
        "met": False,
        "kind": "correctness",
    }
    assert checked["correctness_met"] is False


def test_nested_figures_expressions_and_conditions():
    targets = [
        correctness("policies.queue.refused", "==", 0, when=lambda r: "queue" in r["policies"]),
        correctness("policies.refuse.still_waiting", "==", 0, when=lambda r: "refuse" in r["policies"]),
        correctness("short", "==", Expr("requests - units", lambda r: r["requests"] - r["units"])),
        performance("policies.queue.mean_wait_h", "<", 1.5),
    ]
    checked = block(
        {"policies": {"queue": {"refused": 0, "mean_wait_h": 2.0}}, "requests": 8, "units": 4, "short": 3}, targets
    )
    assert list(checked["targets"]) == [
        "policies.queue.refused == 0",
        "short == requests - units",
        "policies.queue.mean_wait_h < 1.5",
    ]
    assert [c["met"] for c in checked["targets"].values()] == [True, False, False]
    assert checked["targets"]["short == requests - units"]["target"] == 4


def test_an_unknown_operator_is_refused():
    with pytest.raises(ValueError, match="unknown operator '=<'"):
        correctness("x", "=<", 1)


@pytest.mark.parametrize("name", sorted(load()))
def test_every_benchmark_checks_a_correctness_target_and_says_how_the_smoke_runs_it(name):
    bench = REGISTRY[name]
    assert any(t.kind == CORRECTNESS for t in bench.targets)
    assert len({t.name for t in bench.targets}) == len(bench.targets)
    if bench.smoke.skip:
        assert not bench.smoke.args
    else:  # the smoke's arguments are ones the benchmark accepts
        parser = Command().create_parser("manage.py", "bench")
        assert parser.parse_args([name, *bench.smoke.args]).benchmark == name


def test_the_bench_command_prints_the_block_and_fails_on_a_missed_correctness_target(monkeypatch):
    result = {"approved": 0, "units": 4, "double_allocated": 0, "p99_ms": 1.0}
    fake = Benchmark("fake", lambda **_: dict(result), "a fake", [], APPROVALS, Smoke(skip="a test"))
    monkeypatch.setitem(REGISTRY, "fake", fake)
    out = io.StringIO()
    with pytest.raises(
        CommandError, match=r"fake: correctness targets not met: approved == units \(value 0, target 4\)"
    ):
        call_command("bench", "fake", stdout=out)
    printed = json.loads(out.getvalue().strip().splitlines()[-1])
    assert printed["approved"] == 0 and printed["correctness_met"] is False
    assert printed["targets"]["approved == units"]["met"] is False

    result["approved"] = 4
    out = io.StringIO()
    call_command("bench", "fake", stdout=out)
    assert json.loads(out.getvalue().strip().splitlines()[-1])["targets_met"] is True


def test_an_error_instead_of_figures_is_named_in_the_failure():
    with pytest.raises(CommandError, match=r"smoke: correctness targets not met: error: unknown benchmark\(s\): nope"):
        call_command("bench", "smoke", "--only", "nope", stdout=io.StringIO())


def test_the_smoke_skips_what_the_configuration_lacks(monkeypatch, settings):
    monkeypatch.setattr(connection, "vendor", "sqlite")
    settings.CELERY_BROKER_URL = "filesystem://"
    assert missing_services(REGISTRY["poll-cycle"]) == ["postgresql", "redis"]
    assert missing_services(REGISTRY["billing"]) == ["postgresql"]
    assert missing_services(REGISTRY["approvals"]) == []


def test_the_smoke_reports_a_benchmark_that_printed_no_figures():
    """A benchmark process that dies before its JSON line is a failure with the end of its output."""
    broken = Benchmark("mig-planner", None, "", [], [], Smoke(("--cases", "many")))
    outcome = run_one(broken, dict(os.environ), timeout_s=60)
    assert len(outcome["failures"]) == 1
    assert outcome["failures"][0].startswith("exit 2, no JSON line:")
    assert "invalid int value: 'many'" in outcome["failures"][0]
