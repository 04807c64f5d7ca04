"""The demo's processes, run by supervisord (supervisor 4.3.0) instead of a supervisor of our own.

`Supervisord.start()` writes var/supervisor/supervisord.conf and runs `supervisord -n` as a child in a
session of its own; `add()` puts one program into its include directory and asks supervisord over
XML-RPC (a unix socket, mode 0700) to reread the configuration and start it (`reloadConfig` and
`addProcessGroup`: what `supervisorctl update` does). Each program runs in its own process group,
output appended to its log in var/logs/. Supervisor restarts a program that exits (`autorestart=true`);
one that dies within `startsecs` of starting is retried after 1, 2, 3 ... s and given up on (FATAL)
after `startretries` tries. `stop()` sends supervisord SIGTERM: it stops the programs, last started
first (`priority`), SIGTERM to each group and SIGKILL after `stopwaitsecs`, then exits.

Supervisor keeps no crash counts, so `poll()` (once a second in the demo) reads every program's
process info and counts: a run that ended while not stopping is a crash, a new start time after one
is a restart. `write_status()` records them in the JSON file `bench demo-soak` reads. Documented at
https://supervisord.org/configuration.html and https://supervisord.org/api.html.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xmlrpc.client
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from supervisor.xmlrpc import SupervisorTransport

# States of a run that ended (https://supervisord.org/subprocess.html#process-states).
ENDED = ("EXITED", "BACKOFF", "FATAL", "UNKNOWN")
RUNNING = ("STARTING", "RUNNING")
# supervisord's log lines for a spawn, an exit it did not cause and a program given up on (supervisor/process.py).
_SPAWNED = re.compile(r"INFO spawned: '(?P<name>[^']+)' with pid (?P<pid>\d+)")
_EXITED = re.compile(r"(?:INFO|WARN) exited: (?P<name>\S+) \((?P<how>.*); (?:not )?expected\)")
_GAVE_UP = re.compile(r"INFO gave up: (?P<name>\S+) entered FATAL state")
# A unix socket's path must fit sockaddr_un (108 bytes on Linux).
_MAX_SOCKET_PATH = 100


@dataclass
class Program:
    """One supervised command line; `argv` is run as is (put sys.executable first for Python)."""

    name: str
    argv: list[str]
    log: Path
    pid: int = 0
    spawns: int = 0
    crashes: int = 0
    restarts: int = 0
    last_exit: int | None = None  # the exit status, or minus the signal that ended it
    state: str = ""


class Supervisord:
    def __init__(
        self,
        directory: Path,
        *,
        log: Callable[[str], None] = print,
        status_path: Path | None = None,
        startsecs: int = 5,
        startretries: int = 20,
        stopwaitsecs: int = 10,
        cwd: Path | None = None,
    ):
        self.directory = Path(directory)
        self.log = log
        self.status_path = status_path
        self.startsecs, self.startretries, self.stopwaitsecs = startsecs, startretries, stopwaitsecs
        self.cwd = cwd
        self.programs: dict[str, Program] = {}
        self._log_offset = 0
        self.stopping = False
        self.proc: subprocess.Popen | None = None
        self.socket = self.directory / "supervisor.sock"
        if len(str(self.socket)) > _MAX_SOCKET_PATH:
            self.socket = Path(tempfile.mkdtemp(prefix="gpuaas-sv-")) / "supervisor.sock"

    @property
    def rpc(self):
        """The `supervisor` namespace of supervisord's XML-RPC interface (a new connection per call)."""
        transport = SupervisorTransport(None, None, f"unix://{self.socket}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport).supervisor

    def start(self, timeout: float = 30) -> None:
        (self.directory / "programs").mkdir(parents=True, exist_ok=True)
        for stale in (self.directory / "programs").glob("*.conf"):
            stale.unlink()
        config = self.directory / "supervisord.conf"
        config.write_text(
            "[supervisord]\n"
            "nodaemon=true\n"
            f"logfile={self.directory / 'supervisord.log'}\n"
            f"pidfile={self.directory / 'supervisord.pid'}\n"
            f"childlogdir={self.directory}\n"
            "[unix_http_server]\n"
            f"file={self.socket}\n"
            "chmod=0700\n"
            "[supervisorctl]\n"
            f"serverurl=unix://{self.socket}\n"
            "[rpcinterface:supervisor]\n"
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n"
            "[include]\n"
            "files = programs/*.conf\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.directory / "supervisord.out", "ab"),  # noqa: SIM115 - the child keeps its own copy
            start_new_session=True,  # Ctrl-C reaches the demo, which stops supervisord itself
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.rpc.getState()["statename"] == "RUNNING":
                    return
            except (OSError, xmlrpc.client.Fault):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"supervisord did not start; see {self.directory / 'supervisord.log'}")
            time.sleep(0.1)

    def add(self, program: Program) -> Program:
        """Start one program under supervisord, after every program added before it."""
        program.log.parent.mkdir(parents=True, exist_ok=True)
        priority = 100 + 10 * len(self.programs)  # started in this order, stopped in the reverse one
        (self.directory / "programs" / f"{program.name}.conf").write_text(
            f"[program:{program.name}]\n"
            f"command={shlex.join(program.argv)}\n"
            f"directory={self.cwd or Path.cwd()}\n"
            f"priority={priority}\n"
            "autostart=true\n"
            "autorestart=true\n"
            f"startsecs={self.startsecs}\n"
            f"startretries={self.startretries}\n"
            "stopsignal=TERM\n"
            f"stopwaitsecs={self.stopwaitsecs}\n"
            "stopasgroup=true\n"
            "killasgroup=true\n"
            "redirect_stderr=true\n"
            f"stdout_logfile={program.log}\n"
            "stdout_logfile_maxbytes=0\n"
        )
        self.programs[program.name] = program
        self.rpc.reloadConfig()
        self.rpc.addProcessGroup(program.name)
        self.poll()
        return program

    def alive(self, name: str) -> bool:
        return self.programs[name].state in RUNNING

    def poll(self) -> None:
        """Read supervisord's new log lines (crashes, restarts) and every program's state; write the status file."""
        if self.stopping or self.proc is None:
            return
        self._read_events()
        try:
            infos = {info["name"]: info for info in self.rpc.getAllProcessInfo()}
        except (OSError, xmlrpc.client.Fault) as exc:
            self.log(f"supervisor: cannot read supervisord's state: {exc}")
            return
        for name, program in self.programs.items():
            if info := infos.get(name):
                program.state = info["statename"]
                program.pid = info["pid"] or program.pid
        self.write_status()

    def _read_events(self) -> None:
        """Count from supervisord's log, which records every spawn and exit (no run is missed between polls)."""
        try:
            with open(self.directory / "supervisord.log", "rb") as handle:
                handle.seek(self._log_offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._log_offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if (m := _SPAWNED.search(line)) and (program := self.programs.get(m["name"])):
                if program.spawns:
                    program.restarts += 1
                    self.log(f"supervisor: {program.name} restarted (pid {m['pid']}, restart {program.restarts})")
                program.spawns += 1
            elif (m := _EXITED.search(line)) and (program := self.programs.get(m["name"])):
                program.crashes += 1
                program.last_exit = _exit_code(m["how"])
                self.log(
                    f"supervisor: {program.name} exited ({m['how']}); supervisord restarts it "
                    f"(crash {program.crashes}, see {program.log})"
                )
            elif (m := _GAVE_UP.search(line)) and m["name"] in self.programs:
                self.log(f"supervisor: {m['name']} failed to start {self.startretries} times; supervisord gave up")

    def run(self, *, tick: float = 1.0, every_tick: Callable[[], None] | None = None) -> None:
        """Poll every `tick` seconds until KeyboardInterrupt or supervisord's end; does not stop the programs."""
        while self.proc is not None and self.proc.poll() is None:
            self.poll()
            if every_tick:
                every_tick()
            time.sleep(tick)
        self.log(f"supervisor: supervisord exited with status {self.proc.returncode if self.proc else None}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM supervisord (it stops every program group, SIGKILL after stopwaitsecs), wait, then SIGKILL."""
        self.poll()
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for program in self.programs.values():
            if program.state in RUNNING and not _exists(program.pid):
                program.state = "STOPPED"
        self.write_status()

    def status(self) -> dict:
        return {
            "stopping": self.stopping,
            "programs": {
                p.name: {
                    "pid": p.pid or None,
                    "alive": _exists(p.pid) if self.stopping else p.state in RUNNING,
                    "state": p.state,
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


def _exit_code(how: str) -> int | None:
    """`exit status 3` -> 3, `terminated by SIGKILL` -> -9 (subprocess's convention), else None."""
    if how.startswith("exit status "):
        return int(how.split()[2])
    name = how.removeprefix("terminated by ").split()[0]
    return -getattr(signal, name) if name.startswith("SIG") and hasattr(signal, name) else None


def _exists(pid: int) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
