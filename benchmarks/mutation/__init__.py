"""`python manage.py bench mutation --module PATH [--sample N --seed S]`: how many one-change mutants of a module
the tests that reach it kill.

Built on cosmic-ray (8.7.0), a maintained mutation tool, through its Python API: its operator plugins find every
place a module can be mutated (`mutation_positions`) and make one mutant at a time (`mutating.mutate_code`,
parso-based, so the code keeps its formatting and comments). cosmic-ray's own `exec` loop is not used because it
edits the file in the working tree and runs one fixed test command for every mutant; here each mutant is written
into a throwaway copy of the project (the working tree is never touched, even if the run is killed) and tried
against the tests mapped to its module (TESTS_FOR), in a pytest process of its own, so Django's app loading,
settings and migrations run exactly as in the suite. mutmut 3 was not taken: it rewrites every function of the
mutated files into trampolines inside a `mutants/` copy and forks one pytest session per mutant, which needs the
whole suite to run from that copy first to learn which tests reach which function; cosmic-ray fitted first.

Runner (benchmarks/mutation/fork.py): by default each mutant's pytest runs in a child forked from a warm parent
that holds the third-party imports (never the project's), so a mutant no longer pays Django's, Celery's and
pytest's imports; `--runner subprocess` runs one pytest process per mutant, and is the fallback.

Speed: every test process starts from one SQLite test database migrated once per run (a file copy per mutant,
pytest-django's --reuse-db, benchmarks.mutation.db), so a mutant costs Django's start-up and its tests, not the
migrations. Tests marked `postgres` or `redis` are skipped there, as on the embedded default.

Selection (benchmarks/mutation/selection.py): by default each mutant runs only the mapped tests that executed its
statement in one unmutated run under coverage.py (a context per test); a change that runs at import runs them
all, and one no mapped test executes is a survivor reported `not_covered`, without a run. `--selection all`
runs every mapped test for every mutant.

Timeout (`mutant_timeout`): a mutant's tests may take 3 x what they and the run's start-up took unmutated, at
least a minute, so a mutant that loops forever costs minutes, not 3 x the whole mapped list.

Outcomes: pytest exit 1 or 2 (a test failed, or the mutant broke import or collection) or a timeout: killed;
exit 0: survived; any other exit (internal error, usage error, no test collected): an error, which fails the run.
A survivor listed in the module's test folder's EQUIVALENT_MUTANTS.md (`| path:line | operator | change | reason |`)
is reported with that reason; one that is not is `unexplained`. Targets: kill_rate >= 0.9 (killed / mutants run,
equivalents counted as survivors) and no unexplained survivor.
"""

from __future__ import annotations

import ast
import difflib
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from ..registry import Smoke, arg, benchmark
from ..targets import correctness
from . import fork as mutation_fork
from .maps import TESTS_FOR
from .sandbox import IGNORED_IN_COPY, Copy
from .selection import CoverageMap, lines_reached

KILL_RATE_TARGET = 0.9
MUTANT_TIMEOUT_FLOOR_S = 60.0  # no mutant's tests are cut off sooner, however quick they were unmutated
MUTANT_TIMEOUT_FACTOR = 3  # a mutant may take this many times what its tests took unmutated
SELECTIONS = ("coverage", "all")
RUNNERS = ("fork", "subprocess")


# cosmic-ray's core operators, less those that need arguments (VariableReplacer, VariableInserter) and the
# replacements into bitwise, shift and power operators: on datetimes, Decimals and counts they only raise
# TypeError, so every one is killed by any test that runs the line and would only inflate the score.
LEFT_OUT = re.compile(r"_(BitOr|BitAnd|BitXor|LShift|RShift|Pow)$")


@dataclass(frozen=True)
class Mutant:
    operator: str  # cosmic-ray's name without the provider, e.g. ReplaceComparisonOperator_Lt_LtE
    occurrence: int
    line: int
    before: str
    after: str
    code: str

    def where(self, module: str) -> str:
        return f"{module}:{self.line}"

    @property
    def change(self) -> str:
        return f"{self.before} -> {self.after}"


def operators():
    """(name, instance) for each cosmic-ray operator this benchmark uses."""
    import cosmic_ray.plugins

    for name in cosmic_ray.plugins.operator_names():
        cls = cosmic_ray.plugins.get_operator(name)
        if cls.arguments() or LEFT_OUT.search(name):
            continue
        yield name.split("/", 1)[1], cls()


def mutants_of(source: str) -> list[Mutant]:
    """Every one-change mutant cosmic-ray's operators make of `source` that changes what runs, in a fixed order.

    Left out: mutants that are not Python (cosmic-ray also rewrites the `*` of keyword-only parameters, giving
    `def f(a, +, b)`), the `*` made `/` (the same parameters, passed positionally too), and mutants of
    annotations only (`int | None` -> `int + None`), which under `from __future__ import annotations` never run:
    none says anything about the tests."""
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.mutating import mutate_code

    original = source.splitlines()
    runs = _runtime(source)
    out = []
    for name, operator in operators():
        count = sum(1 for node in ast_nodes(get_ast(source)) for _ in operator.mutation_positions(node))
        for occurrence in range(count):
            code = mutate_code(source, operator, occurrence)
            if code is None or _runtime(code) in (None, runs):
                continue
            line, before, after = _first_change(original, code.splitlines())
            out.append(Mutant(name, occurrence, line, before, after, code))
    return out


def _runtime(code: str) -> str | None:
    """The code's syntax tree without annotations, as text; None if it is not Python."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.returns = None
        elif isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, ast.AnnAssign):
            node.annotation = ast.Constant(None)
        elif isinstance(node, ast.arguments):  # `*,` made `/,`: the same parameters, only how they may be passed
            node.args, node.posonlyargs, node.kwonlyargs = node.posonlyargs + node.args + node.kwonlyargs, [], []
            # kw_defaults holds None for a keyword-only parameter without a default: it has none once positional
            node.defaults = node.defaults + [d for d in node.kw_defaults if d is not None]
            node.kw_defaults = []
    return ast.dump(tree)


def _first_change(original: list[str], changed: list[str]) -> tuple[int, str, str]:
    matcher = difflib.SequenceMatcher(a=original, b=changed, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            before = " / ".join(s.strip() for s in original[i1:i2]) or "(nothing)"
            after = " / ".join(s.strip() for s in changed[j1:j2]) or "(removed)"
            return i1 + 1, before, after
    return 0, "", ""


def equivalents_file(module: str) -> Path:
    """The module's test folder's list of equivalent mutants: tests/<app>/EQUIVALENT_MUTANTS.md."""
    return settings.BASE_DIR / "tests" / Path(module).parts[0] / "EQUIVALENT_MUTANTS.md"


ROW = re.compile(
    r"^\|\s*`?(?P<where>[\w/.]+\.py:\d+)`?\s*\|\s*`?(?P<operator>\w+)`?\s*\|(?P<change>.*?)\|(?P<reason>.*)\|\s*$"
)


def equivalents(module: str) -> dict[tuple[str, str], str]:
    """(path:line, operator) -> reason, from the module's EQUIVALENT_MUTANTS.md (absent file: none)."""
    path = equivalents_file(module)
    if not path.exists():
        return {}
    out = {}
    for text in path.read_text().splitlines():
        row = ROW.match(text.strip())
        if row and row["where"].startswith(module + ":"):
            out[(row["where"], row["operator"])] = row["reason"].strip()
    return out


def run_mutation_bench(
    *,
    module: str,
    sample: int = 0,
    seed: int = 8,
    tests: str = "",
    timeout: float = 0,
    selection: str = "coverage",
    also_seeds: list[int] | tuple[int, ...] = (),
    runner: str = "fork",
    stdout=None,
) -> dict:
    started = time.perf_counter()
    module = module.removeprefix("./")
    if selection not in SELECTIONS:
        return {"benchmark": "mutation", "error": f"--selection {selection}: use one of {', '.join(SELECTIONS)}"}
    if runner not in RUNNERS:
        return {"benchmark": "mutation", "error": f"--runner {runner}: use one of {', '.join(RUNNERS)}"}
    if runner == "fork" and not mutation_fork.available():
        runner = "subprocess"
    source_path = settings.BASE_DIR / module
    if not source_path.is_file() or source_path.suffix != ".py":
        return {"benchmark": "mutation", "error": f"--module {module}: no such Python file under {settings.BASE_DIR}"}
    selected = [t.strip() for t in tests.split(",") if t.strip()] or list(TESTS_FOR.get(module, ()))
    if not selected:
        known = ", ".join(sorted(TESTS_FOR))
        return {"benchmark": "mutation", "error": f"no tests mapped to {module}: pass --tests, or map it ({known})"}
    missing = [t for t in selected if not (settings.BASE_DIR / t.split("::")[0]).exists()]
    if missing:
        return {"benchmark": "mutation", "error": f"mapped tests do not exist: {', '.join(missing)}"}

    source = source_path.read_text()
    population = mutants_of(source)
    seeds = list(dict.fromkeys([seed, *also_seeds]))
    draws = {s: _draw(len(population), sample, s) for s in seeds}
    indices = sorted(set().union(*draws.values()))  # a mutant two seeds draw runs once
    mutants = [population[i] for i in indices]

    def say(text: str) -> None:
        if stdout is not None:
            stdout.write(text)

    with tempfile.TemporaryDirectory(prefix="gpuaas-mutation-") as tmp:
        copy = Copy(Path(tmp) / "project")
        shutil.copytree(settings.BASE_DIR, copy.root, ignore=IGNORED_IN_COPY, symlinks=True)
        copy.migrate()
        target = copy.root / module
        base_started = time.perf_counter()
        cover = f"{copy.var / 'mutation-coverage'}|{target}" if selection == "coverage" else ""
        baseline, code, fallback = _baseline(copy, selected, cover, runner)
        runner = "fork" if copy.fork is not None else "subprocess"
        baseline_s = time.perf_counter() - base_started
        if baseline != "passed":
            copy.stop_fork()
            return {
                "benchmark": "mutation",
                "module": module,
                "error": f"the mapped tests fail before any mutation (exit {code}): {copy.last_output[-600:]}",
            }
        for cached in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
            cached.unlink()
        covered = None
        if selection == "coverage":
            order = (copy.var / "mutation-coverage.order").read_text().splitlines()
            covered = CoverageMap.read(copy.var / "mutation-coverage", target, order)
        mutant_seconds: list[float] = []
        results: dict[int, tuple[str, dict]] = {}  # occurrence in the population -> (outcome, row)
        for n, (index, mutant) in enumerate(zip(indices, mutants, strict=True), 1):
            # coverage: only the tests that ran the mutated statement; none ran it: a survivor without a run
            only = covered.tests_for(lines_reached(source, mutant.line)) if covered else None
            tests_run = len(only) if only is not None else None
            per_mutant_s = timeout or mutant_timeout(baseline_s, covered, only)
            mutant_started = time.perf_counter()
            if only == []:
                outcome, code = "not_covered", None
            else:
                target.write_text(mutant.code)
                try:
                    outcome, code = copy.pytest(selected, timeout_s=per_mutant_s, select=only)
                finally:
                    target.write_text(source)
                if outcome == "error" and copy.fork is not None:  # the fork runner's own failure: not the mutant's
                    fallback = f"mutant {n} gave exit {code} in the fork runner: {copy.last_output[-300:]}"
                    copy.stop_fork()
                    target.write_text(mutant.code)
                    try:
                        outcome, code = copy.pytest(selected, timeout_s=per_mutant_s, select=only)
                    finally:
                        target.write_text(source)
                mutant_seconds.append(time.perf_counter() - mutant_started)
            where = mutant.where(module)
            row = {"where": where, "operator": mutant.operator, "change": mutant.change, "tests_run": tests_run}
            row["seconds"] = round(time.perf_counter() - mutant_started, 1)
            row["timeout_s"] = round(per_mutant_s, 1)
            results[index] = (
                outcome,
                {**row, "not_covered": outcome == "not_covered", "exit": code},
            )
            ran_tests = "all" if tests_run is None else tests_run
            say(
                f"mutation: {n}/{len(mutants)} {outcome} ({ran_tests} tests, {row['seconds']} s) {where} "
                f"{mutant.operator}: {mutant.change}"
            )
        runner = "fork" if copy.fork is not None else "subprocess"  # the runner the last mutant ran in
        copy.stop_fork()

    known = equivalents(module)  # read at the end: reasons written while the run went on count
    by_seed = [{"seed": s, **_tally([results[i] for i in sorted(draws[s])], known)} for s in seeds]
    first = by_seed[0]
    killed, survivors, timeouts = first["killed"], first["survivors"], first["timeouts"]
    errors = _tally(list(results.values()), known)["error_mutants"]  # any seed's: an error fails the whole run
    ran, equivalent, unexplained = first["mutants"], first["equivalent"], first["unexplained_survivors"]
    return {
        "benchmark": "mutation",
        "tool": "cosmic-ray 8.7.0 (operators and mutation; runner: this module)",
        "module": module,
        "tests": selected,
        "seed": seed,
        "sample": sample,
        "mutants_possible": len(population),
        "mutants": ran,
        "killed": killed,
        "survived": len(survivors),
        "timeouts": timeouts,
        "errors": len(errors),
        "error_mutants": errors,
        "kill_rate": round(killed / ran, 4) if ran else None,
        "kill_rate_without_equivalents": round(killed / (ran - equivalent), 4) if ran - equivalent else None,
        "equivalent": equivalent,
        "unexplained_survivors": unexplained,
        "survivors": survivors,
        "baseline_s": round(baseline_s, 1),
        "runner": runner,
        "runner_fallback": fallback or copy.fork_lost,
        "selection": selection,
        "by_seed": [{k: v for k, v in row.items() if k != "error_mutants"} for row in by_seed],
        "kill_rate_min": min((row["kill_rate"] for row in by_seed), default=None, key=lambda r: -1 if r is None else r),
        "unexplained_survivors_all_seeds": sum(row["unexplained_survivors"] for row in by_seed),
        "not_covered": sum(1 for s in survivors if s["not_covered"]),
        "mutants_run": len(mutants),
        "mutant_s_mean": round(sum(mutant_seconds) / len(mutant_seconds), 1) if mutant_seconds else None,
        "mutant_s_max": round(max(mutant_seconds), 1) if mutant_seconds else None,
        "seconds": round(time.perf_counter() - started, 1),
    }


def mutant_timeout(baseline_s: float, covered: CoverageMap | None, only: list[str] | None) -> float:
    """Seconds one mutant's tests may run before it counts as killed by a timeout.

    A mutant that makes a loop endless (the forecast's simulation, a retry) never ends, so it is cut off; its
    timeout is sized from what the tests it runs took unmutated, not from the whole mapped list: 3 x (their
    seconds + the run's start-up, which is the baseline less all its tests' seconds), at least a minute, at most
    3 x the baseline. A mutant that runs every mapped test (import-time code, `--selection all`) gets 3 x the
    baseline, as a run without timings does."""
    whole = max(MUTANT_TIMEOUT_FLOOR_S, MUTANT_TIMEOUT_FACTOR * baseline_s)
    if covered is None or only is None or not covered.seconds:
        return whole
    start_up = max(0.0, baseline_s - covered.seconds_for(covered.order))
    own = MUTANT_TIMEOUT_FACTOR * (start_up + covered.seconds_for(only))
    return min(whole, max(MUTANT_TIMEOUT_FLOOR_S, own))


def _baseline(copy: Copy, selected: list[str], cover: str, runner: str) -> tuple[str, int | None, str | None]:
    """The unmutated run, in the runner the mutants will use, and why the fork runner was given up, if it was.

    Under "fork" the unmutated run is the fork runner's own check: a child that fails tests the mapped suite
    passes would count every mutant killed, so the run falls back to one pytest process per mutant instead.
    Once it passes, the warm parent imports the outside modules the run used, for every later child."""
    modules = copy.var / "mutation-modules.txt"
    fallback = None
    if runner == "fork":
        try:
            copy.start_fork()
        except RuntimeError as failed:
            fallback = str(failed)[-600:]
        else:
            outcome, code = copy.pytest(selected, timeout_s=1800, write_bytecode=True, cover=cover, modules=modules)
            if outcome == "passed":
                copy.fork.hold(modules)
                return outcome, code, None
            fallback = f"the unmutated tests gave exit {code} in the fork runner: {copy.last_output[-300:]}"
            copy.stop_fork()
    outcome, code = copy.pytest(selected, timeout_s=1800, write_bytecode=True, cover=cover)
    return outcome, code, fallback


def _draw(size: int, sample: int, seed: int) -> set[int]:
    """The occurrences `--sample N --seed S` draws from a population of `size` (0: every mutant)."""
    return set(random.Random(seed).sample(range(size), min(sample, size))) if sample else set(range(size))


def _tally(results: list[tuple[str, dict]], known: dict[tuple[str, str], str]) -> dict:
    """One seed's figures from the outcomes of the mutants it drew."""
    outcomes = [outcome for outcome, _ in results]
    killed = sum(1 for o in outcomes if o in ("failed", "timeout"))
    survivors = [
        {**{k: v for k, v in row.items() if k != "exit"}, "equivalent": known.get((row["where"], row["operator"]))}
        for outcome, row in results
        if outcome in ("passed", "not_covered")
    ]
    errors = [{k: row[k] for k in ("where", "operator", "exit")} for outcome, row in results if outcome == "error"]
    ran = killed + len(survivors)
    equivalent = sum(1 for s in survivors if s["equivalent"])
    return {
        "mutants": ran,
        "killed": killed,
        "kill_rate": round(killed / ran, 4) if ran else None,
        "equivalent": equivalent,
        "unexplained_survivors": len(survivors) - equivalent,
        "timeouts": outcomes.count("timeout"),
        "survivors": survivors,
        "error_mutants": errors,
    }


@benchmark(
    "mutation",
    help="Mutation score of one module against the tests that reach it (cosmic-ray operators; docs/benchmarks.md).",
    arguments=[
        arg("--module", required=True, help="The module to mutate, a path from the project root."),
        arg("--sample", type=int, default=0, help="Mutants to draw at random (0: every mutant)."),
        arg("--seed", type=int, default=8, help="Seed of the draw."),
        arg(
            "--also-seeds",
            default="",
            help="Comma-separated further seeds drawn in the same run (one copy and one unmutated run for all); "
            "`by_seed` gives each seed's figures, the other keys the --seed draw's.",
        ),
        arg("--tests", default="", help="Comma-separated test paths instead of the module's mapped tests."),
        arg(
            "--timeout",
            type=float,
            default=0,
            help="Seconds one mutant's tests may take (0: 3 x what its own tests and start-up took unmutated).",
        ),
        arg(
            "--selection",
            default="coverage",
            choices=SELECTIONS,
            help="coverage: each mutant runs the mapped tests that execute its line; all: every mapped test.",
        ),
        arg(
            "--runner",
            default="fork",
            choices=RUNNERS,
            help="fork: each mutant's pytest runs in a child forked from a warm parent (benchmarks/mutation/fork.py);"
            " subprocess: a pytest process per mutant (also the fallback where fork is unavailable or fails).",
        ),
    ],
    targets=[
        correctness("mutants", ">=", 1),
        correctness("errors", "==", 0),
        correctness("kill_rate", ">=", KILL_RATE_TARGET),
        correctness("unexplained_survivors", "==", 0),
        correctness("kill_rate_min", ">=", KILL_RATE_TARGET),
        correctness("unexplained_survivors_all_seeds", "==", 0),
    ],
    # The smoke tries 3 mutants against the pure property tests only, so it fits the smoke's 240 s on a busy machine.
    smoke=Smoke(
        args=(
            "--module",
            "billing/services/intervals.py",
            "--sample",
            "3",
            "--seed",
            "8",
            "--tests",
            "tests/billing/test_billing_intervals_properties.py",
        )
    ),
)
def mutation(
    *,
    stdout,
    module: str,
    sample: int = 0,
    seed: int = 8,
    tests: str = "",
    timeout: float = 0,
    selection="coverage",
    also_seeds: str = "",
    runner: str = "fork",
    **_,
) -> dict:
    try:
        more = [int(s) for s in also_seeds.split(",") if s.strip()]
    except ValueError:
        return {"benchmark": "mutation", "error": f"--also-seeds {also_seeds}: give whole numbers, e.g. 1,2"}
    return run_mutation_bench(
        module=module,
        sample=sample,
        seed=seed,
        also_seeds=more,
        tests=tests,
        timeout=timeout,
        selection=selection,
        runner=runner,
        stdout=stdout,
    )
