"""`bench mutation`'s warm fork runner: one process that has imported the heavy third-party modules forks a child
per test run, and the child runs `pytest.main()` in-process against the project copy.

Why: a mutant's own work is a few tests (pytest -x, coverage-guided selection), but a fresh pytest process first
imports Django, DRF, Celery, kombu, the Kubernetes client, Hypothesis, schemathesis, pytest and its plugins; on
the loaded 2-core machine that start-up was most of each mutant's 30 s to 3 minutes.

What the warm parent holds: only modules from outside the project copy. It never calls `django.setup()` and never
imports an app, so each child imports the (mutated) project fresh, configures Django, loads its apps and runs the
tests exactly as `python -m pytest` would; a third-party module that needs settings or the app registry at import
fails there and is simply imported by each child. The list of modules to hold is learnt from the unmutated run:
the plugin `benchmarks.mutation.db` writes the names of the outside modules it had imported (GPUAAS_MUTATION_MODULES),
and the parent imports them, in that order, before the first mutant.

Protocol (JSON lines): the parent reads requests on stdin and answers on the stdout it had at start (its own fd 1
goes to stderr, so nothing an import prints can break a reply). `{"import": file}` imports the names in the file;
`{"args": [...], "env": {...}, "timeout_s": s, "output": path, "write_bytecode": bool}` forks, and answers
`{"exit": code}` or `{"exit": null, "timeout": true}` (the child's process group is killed at the timeout).

Run as a script from the copy's root (`python benchmarks/mutation/fork.py`); `WarmFork` is the side the benchmark
uses. Where os.fork is missing, the benchmark runs one pytest process per mutant as before (`--runner subprocess`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

# Imported before the first run, before any list is learnt: what every billing test process imports first.
# A name that is not installed or needs Django's settings at import is skipped.
HEAVY = (
    "django",
    "django.db.models",
    "django.test",
    "django.core.management",
    "rest_framework",
    "celery",
    "kombu",
    "kubernetes.client",
    "pynvml",
    "hypothesis",
    "hypothesis.strategies",
    "drf_spectacular",
    "guardian",
    "coverage",
    "pytest",
    "pytest_django",
    "pytest_django.plugin",
    "schemathesis",
)
SCRIPT = Path(*__name__.split(".")).with_suffix(".py")  # this file, from the project root, wherever it moves
REPLY_GRACE_S = 120.0  # beyond a run's own timeout (which the parent enforces), before the parent counts as lost


def available() -> bool:
    return hasattr(os, "fork")


# The warm parent (the script's side) ---------------------------------------------------------------------


def _import_all(names: list[str]) -> tuple[int, int]:
    held = failed = 0
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            held += 1
        except BaseException:  # noqa: BLE001 - needs settings or apps, or not importable alone: the child imports it
            failed += 1
    return held, failed


def _child(request: dict) -> None:
    """In the forked child: become the test process of `request`, run pytest, and exit with its code."""
    code = 3
    try:
        os.setpgid(0, 0)  # the parent kills the whole group at the timeout, subprocesses included
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process exits with os._exit below
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(request["env"])
        sys.dont_write_bytecode = not request.get("write_bytecode", False)
        sys.argv = ["pytest", *request["args"]]
        import pytest

        code = int(pytest.main(list(request["args"])))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 3
    except BaseException:  # noqa: BLE001 - escaped pytest (e.g. a mutant that breaks django.setup() in a plugin):
        import traceback  # `python -m pytest` would print it and exit 1, so the child does the same

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run(request: dict) -> dict:
    pid = os.fork()
    if pid == 0:
        _child(request)
    deadline = time.monotonic() + float(request["timeout_s"])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"exit": os.waitstatus_to_exitcode(status)}
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"exit": None, "timeout": True}
        time.sleep(0.05)


def serve() -> None:
    sys.path[0] = os.getcwd()  # run as a script: the copy's root, not benchmarks/, is where imports start
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever an import prints goes to stderr, never into a reply
    held, failed = _import_all(list(HEAVY))
    replies.write(json.dumps({"ready": True, "held": held, "failed": failed}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if "import" in request:
            names = Path(request["import"]).read_text().split()
            held, failed = _import_all(names)
            answer = {"held": held, "failed": failed, "modules": len(sys.modules)}
        else:
            answer = _run(request)
        replies.write(json.dumps(answer) + "\n")


# The benchmark's side ------------------------------------------------------------------------------------


class WarmFork:
    """The benchmark's handle on one warm parent started in `root` (the project copy) with `env`."""

    def __init__(self, root: Path, env: dict[str, str], log: Path):
        self.log = log
        with open(log, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(root / SCRIPT)],
                cwd=root,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.started = self._reply(600.0)

    def _reply(self, timeout_s: float) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise RuntimeError(f"the warm fork parent stopped answering: {self.log.read_text()[-600:]}")
        return json.loads(line)

    def _ask(self, request: dict, timeout_s: float) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._reply(timeout_s)

    def hold(self, modules_file: Path) -> dict:
        """Import the modules named in `modules_file` into the parent, so that no later child imports them."""
        return self._ask({"import": str(modules_file)}, 600.0)

    def pytest(self, args: list[str], env: dict[str, str], timeout_s: float, output: Path, *, write_bytecode: bool):
        """pytest's exit code in a forked child, or None at the timeout."""
        request = {
            "args": args,
            "env": env,
            "timeout_s": timeout_s,
            "output": str(output),
            "write_bytecode": write_bytecode,
        }
        return self._ask(request, timeout_s + REPLY_GRACE_S)["exit"]

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    serve()
