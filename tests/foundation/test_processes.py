"""The demo's processes under supervisord (gpuaas.demo.processes): a killed child is restarted, the others stay
up, the counts reach the status file `bench demo-soak` reads, and stopping ends every process group."""

import json
import os
import signal
import sys
import time

import pytest

from gpuaas.demo.processes import Program, Supervisord

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
# A child that starts a grandchild in its own process group: stopping must end both.
PARENT = [
    sys.executable,
    "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(120)']); print('started', flush=True); time.sleep(120)",
]


def wait_for(predicate, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def supervisord(tmp_path):
    lines = []
    sv = Supervisord(tmp_path / "sv", log=lines.append, status_path=tmp_path / "status.json", startsecs=1)
    sv.lines = lines
    sv.start()
    yield sv
    sv.stop()


def running(sv, name):
    def check():
        sv.poll()
        return sv.programs[name].state == "RUNNING"

    return check


def test_a_killed_child_is_restarted_and_the_others_stay_up(supervisord, tmp_path):
    web = supervisord.add(Program("web", SLEEPER, tmp_path / "logs" / "web.log"))
    worker = supervisord.add(Program("worker", SLEEPER, tmp_path / "logs" / "worker.log"))
    wait_for(running(supervisord, "web"), "web to run")
    wait_for(running(supervisord, "worker"), "worker to run")
    web_pid, first_worker_pid = web.pid, worker.pid
    os.kill(first_worker_pid, signal.SIGKILL)
    wait_for(lambda: running(supervisord, "worker")() and worker.pid != first_worker_pid, "worker's restart")
    assert (worker.crashes, worker.restarts, worker.last_exit) == (1, 1, -signal.SIGKILL)
    assert web.pid == web_pid and (web.crashes, web.restarts) == (0, 0) and supervisord.alive("web")
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["crashes"], status["restarts"]) == (1, 1)
    assert status["programs"]["worker"] | {"pid": None} == {
        "pid": None,
        "alive": True,
        "state": "RUNNING",
        "crashes": 1,
        "restarts": 1,
        "last_exit": -signal.SIGKILL,
    }
    assert any(line.startswith("supervisor: worker exited (") for line in supervisord.lines)
    assert f"supervisor: worker restarted (pid {worker.pid}, restart 1)" in supervisord.lines


def test_stop_ends_every_process_group_and_is_not_a_crash(supervisord, tmp_path):
    parent = supervisord.add(Program("parent", PARENT, tmp_path / "logs" / "parent.log"))
    wait_for(running(supervisord, "parent"), "parent to run")
    wait_for(lambda: "started" in (tmp_path / "logs" / "parent.log").read_text(), "the grandchild")
    group = os.getpgid(parent.pid)
    assert group == parent.pid  # supervisord starts each program in a process group of its own
    supervisord.stop()
    wait_for(lambda: not group_exists(group), "the group to end (the grandchild included)", timeout=10)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["stopping"] is True and status["crashes"] == 0
    assert status["programs"]["parent"]["alive"] is False
