"""Coverage-guided test selection for `bench mutation`: each mutant runs only the mapped tests that execute its line.

The unmutated mapped tests run once under coverage.py (7.17.3), with one coverage context per test: the pytest
plugin `benchmarks.mutation.db` calls `Coverage.switch_context(item.nodeid)` around each test's setup, call and
teardown, as pytest-cov's `--cov-context=test` does. `CoverageMap` then answers, for each line of the module,
which test node ids ran it (`CoverageData.contexts_by_lineno`).

Why this does not weaken a mutant: a test that never executes the mutated code behaves exactly as it did
unmutated, so it cannot kill the mutant. Two things make "executes the mutated code" wider than "ran the line":

- Code that runs when the module is imported (module and class level: constants, decorators, default arguments,
  `def` and `class` lines) changes what every later test sees, and Django imports the module before any test
  starts, outside every test's context. A mutant there runs the whole mapped list (`lines_reached` gives None).
- A statement can span lines, and a mutant's first changed line need not be the one coverage records. The
  mutant is mapped to the innermost statement holding its line (with its decorators), and a test counts if it
  ran any line of that statement (for a compound statement, any line of its body too: a test that ran the body
  ran the header first). This is a superset of the tests that ran the changed code.

- A test can read an answer an earlier test cached without running the lines that compute it: while coverage
  measures, the plugin empties the module's own `functools.lru_cache` functions before each test, so every test
  that needs such an answer runs its lines and is selected.

What it cannot see: a fixture wider than one test whose value was built by the mutated code, or a cache outside
the module filled by one test from the module's answers and read by another. A mutant on a line no mapped
test executes is a survivor without any test run (`not_covered`).
"""

from __future__ import annotations

import ast
from pathlib import Path

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _start(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)])


def _statements_in_functions(tree: ast.AST) -> list[ast.stmt]:
    """Every statement that runs only when a function runs: those in the body of a function, at any depth."""
    out: list[ast.stmt] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            # a function's body runs when it is called; its decorators, defaults and annotations when it is defined
            inner = in_function or (isinstance(node, FUNCTIONS) and field == "body")
            for child in children:
                if not isinstance(child, ast.AST):
                    continue
                if isinstance(child, ast.stmt) and inner:
                    out.append(child)
                visit(child, inner)

    visit(tree, False)
    return out


def lines_reached(source: str, line: int) -> range | None:
    """The lines whose execution reaches a change on `line`: the innermost statement inside a function body that
    holds it, decorators included; None when the line runs at import (module or class level) or holds no
    statement, so every mapped test must run."""
    holding = [s for s in _statements_in_functions(ast.parse(source)) if _start(s) <= line <= s.end_lineno]
    if not holding:
        return None
    innermost = max(holding, key=lambda s: (_start(s), -s.end_lineno))
    return range(_start(innermost), innermost.end_lineno + 1)


class CoverageMap:
    """Which test node ids ran each line of one file, from a coverage data file with one context per test."""

    def __init__(self, by_line: dict[int, set[str]], order: list[str], seconds: dict[str, float] | None = None):
        self.by_line = by_line
        self.order = order  # every collected node id, in the order pytest ran them
        self.seconds = seconds or {}  # node id -> its seconds in the unmutated run (under coverage)

    @classmethod
    def read(cls, data_file: Path, source_file: Path, order: list[str]) -> CoverageMap:
        from coverage import CoverageData

        data = CoverageData(basename=str(data_file))
        data.read()
        measured = next((f for f in data.measured_files() if Path(f).resolve() == source_file.resolve()), None)
        by_line: dict[int, set[str]] = {}
        if measured is not None:
            for lineno, contexts in data.contexts_by_lineno(measured).items():
                tests = {c for c in contexts if c}  # "" is the time outside any test (imports, collection)
                if tests:
                    by_line[lineno] = tests
        timed = Path(f"{data_file}.seconds")
        lines = timed.read_text().splitlines() if timed.exists() else []
        seconds = {nodeid: float(s) for nodeid, s in (line.rsplit("\t", 1) for line in lines)}
        return cls(by_line, order, seconds)

    def seconds_for(self, node_ids: list[str]) -> float:
        """What `node_ids` took together in the unmutated run (a test without a timing counts 0)."""
        return sum(self.seconds.get(n, 0.0) for n in node_ids)

    def tests_for(self, lines: range | None) -> list[str]:
        """The node ids to run for a mutant reaching `lines`, in the order pytest ran them; every test for None."""
        if lines is None:
            return list(self.order)
        wanted = set().union(*(self.by_line.get(n, set()) for n in lines))
        return [t for t in self.order if t in wanted]


def files_of(node_ids: list[str]) -> list[str]:
    """The files holding `node_ids`, each once, in order: what pytest is given before the plugin filters."""
    return list(dict.fromkeys(n.split("::", 1)[0] for n in node_ids))
