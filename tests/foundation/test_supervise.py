"""The demo's supervisor restarts a crashed child with backoff and leaves the others running."""

import json
import sys

from gpuaas.demo.supervise import Program, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
CRASHER = [sys.executable, "-c", "raise SystemExit(3)"]


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def wait_exit(sup, name):
    sup.programs[name].proc.wait(30)


def test_crashed_child_is_restarted_and_the_others_stay_up(tmp_path):
    clock, lines = FakeClock(), []
    sup = Supervisor(
        [Program("web", SLEEPER, tmp_path / "web.log"), Program("worker", CRASHER, tmp_path / "worker.log")],
        log=lines.append,
        clock=clock,
        status_path=tmp_path / "status.json",
    )
    try:
        sup.start_all()
        web_pid, first_worker_pid = sup.programs["web"].proc.pid, sup.programs["worker"].proc.pid
        wait_exit(sup, "worker")
        sup.poll()
        worker = sup.programs["worker"]
        assert (worker.crashes, worker.restarts, worker.last_exit) == (1, 0, 3)
        assert worker.restart_at == 1001.0  # backoff 1 s, not restarted yet
        assert worker.proc.pid == first_worker_pid
        clock.now = 1001.0
        worker.argv = SLEEPER  # the next run stays up
        sup.poll()
        assert (worker.crashes, worker.restarts) == (1, 1)
        assert worker.proc.pid != first_worker_pid and sup.alive("worker")
        assert sup.programs["web"].proc.pid == web_pid and sup.alive("web")
        assert (sup.programs["web"].crashes, sup.programs["web"].restarts) == (0, 0)
        status = json.loads((tmp_path / "status.json").read_text())
        assert (status["crashes"], status["restarts"]) == (1, 1)
        assert status["programs"]["worker"] == {
            "pid": worker.proc.pid,
            "alive": True,
            "crashes": 1,
            "restarts": 1,
            "last_exit": 3,
        }
        assert lines[0].startswith("supervisor: worker exited with status 3 after ")
        assert lines[1] == f"supervisor: worker restarted (pid {worker.proc.pid}, restart 1)"
    finally:
        sup.stop()
    assert not sup.alive("web") and not sup.alive("worker")
    assert json.loads((tmp_path / "status.json").read_text())["stopping"] is True


def test_backoff_doubles_on_quick_crashes_and_resets_after_a_stable_run(tmp_path):
    clock = FakeClock()
    sup = Supervisor(
        [Program("worker", CRASHER, tmp_path / "w.log")],
        log=lambda line: None,
        clock=clock,
        stable_after=60,
        backoff_max=4,
    )
    worker = sup.programs["worker"]
    delays = []
    try:
        sup.start_all()
        for _ in range(4):
            wait_exit(sup, "worker")
            sup.poll()
            delays.append(worker.backoff)
            clock.now = worker.restart_at
            sup.poll()
        assert delays == [1, 2, 4, 4]
        wait_exit(sup, "worker")
        clock.now += 61  # this run lasted longer than stable_after
        sup.poll()
        assert worker.backoff == 1
        assert (worker.crashes, worker.restarts) == (5, 4)
    finally:
        sup.stop()


def test_stop_is_not_counted_as_a_crash(tmp_path):
    sup = Supervisor([Program("web", SLEEPER, tmp_path / "web.log")], log=lambda line: None)
    sup.start_all()
    sup.stop()
    sup.poll()
    assert (sup.programs["web"].crashes, sup.programs["web"].restarts) == (0, 0)
    assert sup.programs["web"].proc.returncode is not None
    assert not sup.alive("web")
