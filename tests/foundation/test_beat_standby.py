"""Two real beats on Redis: the standby takes over within one period of a SIGKILL, and no tick is doubled.

Both beats (`celery -A gpuaas beat`, celery-redbeat chosen by gpuaas.settings because the broker is Redis)
and a worker run as subprocesses with beat_switchover_settings: one entry every PERIOD_S on its own queue,
the loop and lock that gpuaas.settings.beat_takeover derives from it. beat_switchover_tasks records each
tick as the beat sends it (which beat, when, the task id) and as the worker runs it. The beat that sends
is SIGKILLed, so its lock is never released and must lapse; the other one must take over.

Kept apart from the rest of the schedule's semantics: a tick is a send of the entry; "doubled" means two
sends less than a period apart (or one task id run twice); "within one period" means the standby's first
send comes at most one period after the slot that was due (at most two periods after the last send).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings

from gpuaas.settings import beat_takeover

ROOT = Path(__file__).resolve().parents[2]
PERIOD_S = 8
SENT = "beat-switchover-test:sent"
RAN = "beat-switchover-test:ran"
QUEUE = "beat-switchover"
DEADLINE_S = 90  # a bound on waiting, not an assertion on time
# Sends are stamped with time.time() just after Celery reserves the entry, on a loaded machine.
CLOCK_SLACK_S = 0.5


@pytest.fixture
def store():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)

    def clean():
        keys = list(client.scan_iter("beat-switchover-test*")) + [QUEUE]
        client.delete(*keys)

    clean()
    yield client
    clean()


class Processes:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.foundation.beat_switchover_settings",
            "BEAT_SWITCHOVER_PERIOD_S": str(PERIOD_S),
            "GPUAAS_VAR_DIR": str(tmp_path / "var"),
        }
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "gpuaas", *args, "--loglevel", "INFO"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        process.log = log
        self.started.append(process)
        return process

    def beat(self, name: str) -> subprocess.Popen:
        return self.start(name, "beat", "--schedule", str(self.tmp_path / f"{name}-schedule"))

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.log.close()

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name} ({p.pid}):\n" + Path(p.log.name).read_text()[-3000:] for p in self.started)


def sends(client: redis.Redis) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(SENT, 0, -1)]


def wait_until(condition, what: str, processes: Processes):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}\n{processes.logs()}")


def test_the_rule_gives_a_takeover_within_the_shortest_period():
    loop, lock = beat_takeover({"x": {"schedule": timedelta(seconds=PERIOD_S)}})
    assert (loop, lock) == (1, 4) and loop + lock < PERIOD_S
    # The production schedule's shortest period is 30 s (WORKFLOW_SWEEP_S, METRICS_INTERVAL_S, ...).
    assert beat_takeover(settings.CELERY_BEAT_SCHEDULE) == (5, 20)


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("kill_after_s", [0.0, PERIOD_S - 1.5], ids=["just-after-a-tick", "just-before-the-next"])
def test_the_standby_takes_over_a_killed_beat_within_one_period_without_a_doubled_tick(store, tmp_path, kill_after_s):
    processes = Processes(tmp_path)
    try:
        worker = processes.start("worker", "worker", "--queues", QUEUE, "--pool", "solo", "--without-gossip")
        # Ready before the first tick, which expires after a period like every entry.
        wait_until(lambda: b"ready." in Path(worker.log.name).read_bytes(), "the worker", processes)
        beats = {p.pid: p for p in (processes.beat("beat-a"), processes.beat("beat-b"))}

        # Whichever beat took the lock sends; the other one waits on it and sends nothing.
        wait_until(lambda: len(sends(store)) >= 2, "two ticks from the active beat", processes)
        active = sends(store)[-1]["beat"]
        (standby,) = set(beats) - {active}
        assert beats[standby].poll() is None, processes.logs()  # waiting on the lock, not gone
        time.sleep(kill_after_s)
        beats[active].send_signal(signal.SIGKILL)  # its lock is never released: it has to lapse
        beats[active].wait()
        killed_at = time.time()

        wait_until(
            lambda: sum(1 for s in sends(store) if s["beat"] == standby) >= 2, "two ticks from the standby", processes
        )
        beats[standby].send_signal(signal.SIGTERM)
        beats[standby].wait(timeout=30)
        sent = sends(store)
        wait_until(lambda: store.llen(RAN) >= len(sent), "the worker to run every tick sent", processes)
        time.sleep(1)  # a tick run twice would be recorded by now
        ran = [raw.decode() for raw in store.lrange(RAN, 0, -1)]
        assert worker.poll() is None, processes.logs()
    finally:
        processes.stop()

    who = [s["beat"] for s in sent]
    before = [s for s in sent if s["at"] <= killed_at]
    # Only the lock holder sent before the kill, only the standby after it: never both at once.
    assert {s["beat"] for s in before} == {active}, who
    assert who == [active] * len(before) + [standby] * (len(sent) - len(before)), who

    # One send per slot: consecutive sends at least a period apart (none doubled), at most two (none
    # skipped beyond one period, the switchover included).
    gaps = [later["at"] - earlier["at"] for earlier, later in zip(sent, sent[1:], strict=False)]
    assert min(gaps) >= PERIOD_S - CLOCK_SLACK_S, gaps
    assert max(gaps) <= 2 * PERIOD_S, gaps
    # Sharper: the standby held the lock within lock + loop of the kill, and sent then if the slot was due.
    loop, lock = beat_takeover({"x": {"schedule": timedelta(seconds=PERIOD_S)}})
    due = max(before[-1]["at"] + PERIOD_S, killed_at + lock + loop)
    assert sent[len(before)]["at"] <= due + 2 * CLOCK_SLACK_S, (sent[len(before)]["at"] - due, gaps)

    # Every tick sent ran exactly once on the worker.
    assert Counter(ran) == Counter(s["id"] for s in sent)
