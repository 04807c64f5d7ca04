"""A small process supervisor for `manage.py demo`: restart what dies, keep the rest running.

Each `Program` is started in its own process group with its output appended to a log file. `poll()`
looks at every child once: one that exited while the supervisor was not stopping is a crash; it is
logged, counted and restarted after a backoff (1 s, doubling up to 60 s, back to 1 s once a run
lasted `stable_after` seconds). The other children are not touched. `stop()` sends SIGTERM to every
process group, waits, then SIGKILLs what is left. `write_status()` records pids and counts in a JSON
file that `bench demo-soak` reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Program:
    """One supervised command line; `argv` is run as is (put sys.executable first for Python)."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)
    started_at: float = 0.0
    crashes: int = 0
    restarts: int = 0
    restart_at: float | None = None
    backoff: float = 0.0
    last_exit: int | None = None

    def returncode_text(self) -> str:
        code = self.last_exit
        if code is not None and code < 0:
            try:
                return f"{code} ({signal.Signals(-code).name})"
            except ValueError:
                pass
        return str(code)


class Supervisor:
    def __init__(
        self,
        programs: list[Program] = (),
        *,
        log: Callable[[str], None] = print,
        backoff_start: float = 1.0,
        backoff_max: float = 60.0,
        stable_after: float = 60.0,
        status_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.programs: dict[str, Program] = {}
        self.log = log
        self.backoff_start = backoff_start
        self.backoff_max = backoff_max
        self.stable_after = stable_after
        self.status_path = status_path
        self.clock = clock
        self.stopping = False
        for program in programs:
            self.add(program)

    def add(self, program: Program, *, start: bool = False) -> Program:
        self.programs[program.name] = program
        if start:
            self._spawn(program)
        return program

    def start_all(self) -> None:
        for program in self.programs.values():
            if program.proc is None:
                self._spawn(program)

    def _spawn(self, program: Program) -> None:
        program.log.parent.mkdir(parents=True, exist_ok=True)
        with open(program.log, "ab") as handle:  # the child keeps its own copy of the descriptor
            program.proc = subprocess.Popen(
                program.argv,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **program.env} if program.env else None,
            )
        program.started_at = self.clock()
        program.restart_at = None

    def alive(self, name: str) -> bool:
        proc = self.programs[name].proc
        return proc is not None and proc.poll() is None

    def poll(self) -> None:
        """One pass: notice crashed children, restart those whose backoff is over."""
        if self.stopping:
            return
        now = self.clock()
        for program in self.programs.values():
            if program.proc is None:
                continue
            if program.restart_at is None and program.proc.poll() is not None:
                program.crashes += 1
                program.last_exit = program.proc.returncode
                ran = now - program.started_at
                if ran >= self.stable_after or program.backoff == 0:
                    program.backoff = self.backoff_start
                else:
                    program.backoff = min(program.backoff * 2, self.backoff_max)
                program.restart_at = now + program.backoff
                self.log(
                    f"supervisor: {program.name} exited with status {program.returncode_text()} after {ran:.0f} s; "
                    f"restarting in {program.backoff:.0f} s (crash {program.crashes}, see {program.log})"
                )
            elif program.restart_at is not None and now >= program.restart_at:
                self._spawn(program)
                program.restarts += 1
                self.log(f"supervisor: {program.name} restarted (pid {program.proc.pid}, restart {program.restarts})")
        self.write_status()

    def run(
        self,
        *,
        tick: float = 1.0,
        until: Callable[[], bool] = lambda: False,
        every_tick: Callable[[], None] | None = None,
    ) -> None:
        """Poll every `tick` seconds until `until()` is true (or KeyboardInterrupt); does not stop children."""
        while not until():
            self.poll()
            if every_tick:
                every_tick()
            time.sleep(tick)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every child's process group (last started first), wait, then SIGKILL."""
        self.stopping = True
        running = [p.proc for p in reversed(self.programs.values()) if p.proc is not None and p.proc.poll() is None]
        for proc in running:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        self.write_status()

    def status(self) -> dict:
        return {
            "stopping": self.stopping,
            "programs": {
                p.name: {
                    "pid": p.proc.pid if p.proc else None,
                    "alive": bool(p.proc and p.proc.poll() is None),
                    "crashes": p.crashes,
                    "restarts": p.restarts,
                    "last_exit": p.last_exit,
                }
                for p in self.programs.values()
            },
            "crashes": sum(p.crashes for p in self.programs.values()),
            "restarts": sum(p.restarts for p in self.programs.values()),
        }

    def write_status(self) -> None:
        if self.status_path is None:
            return
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status()))
        os.replace(tmp, self.status_path)  # readers never see a half-written file


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
