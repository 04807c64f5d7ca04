"""`bench mutation`'s throwaway copy of the project: a migrated SQLite template and one pytest run per mutant.

The working tree is never touched: each mutant is written into the copy (benchmarks/mutation/__init__.py). Every test
run starts from the template, copied (pytest-django's --reuse-db, benchmarks.mutation.db). A run is a child
forked from a warm parent (benchmarks/mutation/fork.py, runner "fork") or a pytest process of its own (runner
"subprocess", and the fallback wherever the fork runner cannot start or fails the unmutated tests).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .fork import WarmFork
from .selection import files_of

IGNORED_IN_COPY = shutil.ignore_patterns(".git", ".venv", "var", "__pycache__", "node_modules", "*.sqlite3*")
# The run's own environment for the test processes: the embedded defaults, never the caller's database or broker.
# DJANGO_SETTINGS_MODULE too: manage.py exports gpuaas.settings, and pytest-django takes the environment's before
# pyproject's gpuaas.settings_test, so the mutants' tests ran under production settings (e.g. MIG_PARTED_SYNC_S).
DROPPED_ENV = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "GPUAAS_REQUIRE_SERVICES",
    "GPUAAS_VAR_DIR",
    "BENCH_CLONE_DATABASE",
    "DJANGO_SETTINGS_MODULE",
)


class Copy:
    """A throwaway copy of the project, with a migrated SQLite template every test process starts from."""

    def __init__(self, root: Path):
        self.root = root
        self.var = root / "var"
        self.template = self.var / "mutation-template.sqlite3"
        self.test_db = self.var / "mutation-test.sqlite3"
        self.last_output = ""
        self.fork: WarmFork | None = None
        self.fork_lost: str | None = None

    def start_fork(self) -> None:
        """Start the warm parent every later run forks from (RuntimeError if it does not come up)."""
        self.var.mkdir(exist_ok=True)
        self.fork = WarmFork(self.root, self.env(write_bytecode=False), self.var / "mutation-fork.log")

    def stop_fork(self) -> None:
        if self.fork is not None:
            self.fork.close()
            self.fork = None

    def env(self, *, write_bytecode: bool) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        env.update(DEBUG="1", GPUAAS_VAR_DIR=str(self.var), GPUAAS_MUTATION_TEST_DB=str(self.test_db))
        if not write_bytecode:  # a mutant written in the same second as the last must never be read from a stale .pyc
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def migrate(self) -> None:
        self.var.mkdir(exist_ok=True)
        env = {**self.env(write_bytecode=True), "DATABASE_URL": f"sqlite:///{self.template}"}
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed in the copy: {done.stderr.strip()[-500:]}")

    def pytest(
        self,
        tests: list[str],
        timeout_s: float,
        *,
        write_bytecode: bool = False,
        select=None,
        cover: str = "",
        modules: Path | None = None,
    ) -> tuple[str, int | None]:
        """("passed" | "failed" | "timeout" | "error", exit code) of the tests against the copy as it is now.

        `select`: only these node ids of `tests` run (benchmarks.mutation.db deselects the rest); `cover`: the
        mutation_db plugin's GPUAAS_MUTATION_COVER, to record which test ran which line; `modules`: where the
        plugin writes the outside modules the run imported (what the warm parent then holds)."""
        shutil.copyfile(self.template, self.test_db)
        env = self.env(write_bytecode=write_bytecode)
        if select is not None:
            (self.var / "mutation-select.txt").write_text("\n".join(select))
            env["GPUAAS_MUTATION_SELECT"] = str(self.var / "mutation-select.txt")
            tests = files_of(select)
        if cover:
            env["GPUAAS_MUTATION_COVER"] = cover
        if modules is not None:
            env["GPUAAS_MUTATION_MODULES"] = str(modules)
        args = ["-x", "-q", "-p", "benchmarks.mutation.db", "--reuse-db", *tests]
        if self.fork is not None:
            output = self.var / "mutation-output.txt"
            try:
                code = self.fork.pytest(args, env, timeout_s, output, write_bytecode=write_bytecode)
            except RuntimeError as lost:  # the warm parent died: this run and the rest go to subprocesses
                self.fork_lost, self.fork = str(lost)[-600:], None
                return self.pytest(tests, timeout_s, write_bytecode=write_bytecode, select=select, cover=cover)
            if code is None:
                return "timeout", None
            self.last_output = output.read_text(errors="replace")[-4000:]
            return _outcome(code), code
        command = [sys.executable, "-m", "pytest", *args]
        try:
            done = subprocess.run(
                command,
                cwd=self.root,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return "timeout", None
        code = done.returncode
        self.last_output = done.stdout[-2000:] + done.stderr[-2000:]
        return _outcome(code), code


def _outcome(code: int) -> str:
    """pytest's exit 0: passed; 1 or 2 (a test failed, or import or collection broke): failed; else an error."""
    return "passed" if code == 0 else "failed" if code in (1, 2) else "error"
