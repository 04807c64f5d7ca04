"""`bench mutation`'s throwaway copy of the project: a migrated SQLite template and one pytest process per run.

The working tree is never touched: each mutant is written into the copy (benchmarks/mutation/__init__.py). Every test
process starts from the template, copied (pytest-django's --reuse-db, benchmarks.mutation.db).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .selection import files_of

IGNORED_IN_COPY = shutil.ignore_patterns(".git", ".venv", "var", "__pycache__", "node_modules", "*.sqlite3*")
# The run's own environment for the test processes: the embedded defaults, never the caller's database or broker.
DROPPED_ENV = ("DATABASE_URL", "CELERY_BROKER_URL", "GPUAAS_REQUIRE_SERVICES", "GPUAAS_VAR_DIR", "BENCH_CLONE_DATABASE")


class Copy:
    """A throwaway copy of the project, with a migrated SQLite template every test process starts from."""

    def __init__(self, root: Path):
        self.root = root
        self.var = root / "var"
        self.template = self.var / "mutation-template.sqlite3"
        self.test_db = self.var / "mutation-test.sqlite3"
        self.last_output = ""

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
        self, tests: list[str], timeout_s: float, *, write_bytecode: bool = False, select=None, cover: str = ""
    ) -> tuple[str, int | None]:
        """("passed" | "failed" | "timeout" | "error", exit code) of the tests against the copy as it is now.

        `select`: only these node ids of `tests` run (benchmarks.mutation.db deselects the rest); `cover`: the
        mutation_db plugin's GPUAAS_MUTATION_COVER, to record which test ran which line."""
        shutil.copyfile(self.template, self.test_db)
        env = self.env(write_bytecode=write_bytecode)
        if select is not None:
            (self.var / "mutation-select.txt").write_text("\n".join(select))
            env["GPUAAS_MUTATION_SELECT"] = str(self.var / "mutation-select.txt")
            tests = files_of(select)
        if cover:
            env["GPUAAS_MUTATION_COVER"] = cover
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "benchmarks.mutation.db", "--reuse-db", *tests]
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
        return ("passed" if code == 0 else "failed" if code in (1, 2) else "error"), code
