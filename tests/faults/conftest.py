"""The fault suite: real Celery worker processes that SIGKILL themselves at a chosen step.

Workers run as subprocesses (`celery worker -P solo`, so the task runs in the process that dies)
against the test database and Redis, with GPUAAS_CRASH_AT naming crash points (core.leases.
crash_point) and a marker directory so each point fires once. `drive()` replaces a dead worker with
a fresh one and runs the sweeps, as beat would, until the workflow is done or the deadline passes.
The killed worker's message stays unacknowledged in Redis for the visibility timeout (an hour): only
the sweep can bring the work back, which is what these tests prove. Leases are 2 s here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LEASE_S = 2
DEADLINE_S = 120  # a bound on waiting, not an assertion on time


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def purge(queues: list[str]) -> None:
    from core.celery import app

    with app.connection_for_write() as connection:
        channel = connection.default_channel
        for queue in queues:
            channel.queue_purge(queue)
        channel.client.delete("unacked", "unacked_index")  # the killed workers' messages


class Workers:
    """Keeps `alive` workers running (a standby saves a start-up per kill); a dead one is replaced."""

    def __init__(self, tmp_path: Path, queues: list[str], crash_at: list[str], alive: int = 2):
        self.alive = alive
        self.queues = queues
        self.crash_at = crash_at
        self.markers = tmp_path / "crashed"
        self.markers.mkdir()
        self.logs = tmp_path / "workers"
        self.logs.mkdir()
        self.started: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "WORKFLOW_LEASE_S": str(LEASE_S),
            "MIG_RECONFIG_POLL_S": "1",
            "KUBERNETES_RETRIES": "0",
            "GPUAAS_VAR_DIR": str(tmp_path / "var"),
            "GPUAAS_CRASH_AT": ",".join(crash_at),
            "GPUAAS_CRASH_MARKER_DIR": str(self.markers),
        }

    def ensure_running(self) -> None:
        while sum(p.poll() is None for p in self.started) < self.alive:
            n = len(self.started)
            log = open(self.logs / f"worker-{n}.log", "wb")  # noqa: SIM115 - closed with the process
            self.started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "gpuaas", "worker", "-P", "solo", "-l", "WARNING"]
                    + ["-Q", ",".join(self.queues), "-n", f"fault{n}@localhost"]
                    + ["--without-heartbeat", "--without-gossip", "--without-mingle"],
                    cwd=REPO,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def crashed(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())

    def killed(self) -> list[int]:
        """Exit codes of the workers that died: -9 for each SIGKILL."""
        return [p.returncode for p in self.started if p.poll() is not None]

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(10)

    def log_tail(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.logs.iterdir()))


@pytest.fixture
def workers(tmp_path, settings):
    """workers(queues, crash_at) -> Workers; every worker it started is killed at the end."""
    settings.WORKFLOW_LEASE_S = LEASE_S
    settings.MIG_RECONFIG_POLL_S = 1
    settings.KUBERNETES_RETRIES = 0
    made: list[Workers] = []

    def make(queues: list[str], crash_at: list[str]) -> Workers:
        purge(queues)
        fleet = Workers(tmp_path, queues, crash_at)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.stop()
        purge(fleet.queues)


class _Restarted:
    """A child process restarted by ensure_running() when it has died (as its Deployment or DaemonSet would)."""

    log: Path
    env: dict
    started: list[subprocess.Popen]

    def argv(self) -> list[str]:
        raise NotImplementedError

    def ensure_running(self) -> None:
        if self.started and self.started[-1].poll() is None:
            return
        log = open(self.log, "ab")  # noqa: SIM115 - closed with the process
        self.started.append(subprocess.Popen(self.argv(), cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


class Agent(_Restarted):
    """One node-agent process for `node` (restarted when it dies, as its DaemonSet would): GPUAAS_ROLE=node-agent,
    DATABASE_URL unset, holding only that node's key, serving only that node's queue."""

    def __init__(self, tmp_path: Path, cluster: str, node: str, crash_at: str = ""):
        from django.conf import settings

        from capacity.agent import protocol
        from core.celery import node_queue

        self.queue = node_queue(cluster, node)
        self.log = tmp_path / "agent.log"
        self.markers = tmp_path / "agent-crashed"
        self.markers.mkdir()
        self.env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {
            "GPUAAS_ROLE": "node-agent",
            "DJANGO_SETTINGS_MODULE": "gpuaas.settings_test",
            "AGENT_NODE_KEY": protocol.node_key(settings.AGENT_SIGNING_SECRET, cluster, node).hex(),
            "AGENT_CLUSTER_NAME": cluster,
            "AGENT_NODE_NAME": node,
            "GPUAAS_CRASH_AT": crash_at,
            "GPUAAS_CRASH_MARKER_DIR": str(self.markers),
        }
        self.started: list[subprocess.Popen] = []

    def argv(self) -> list[str]:
        return (
            [sys.executable, "-m", "celery", "-A", "gpuaas", "worker", "-P", "solo", "-l", "WARNING"]
            + ["-Q", self.queue, "-n", f"agent{len(self.started)}@localhost"]
            + ["--without-heartbeat", "--without-gossip", "--without-mingle"]
        )


class Ingest(_Restarted):
    """One `manage.py ingest-worker` (control plane, with the test database): writes the inventory reports
    node agents publish on the ingest queue. Restarted if it dies."""

    def __init__(self, tmp_path: Path):
        self.log = tmp_path / "ingest.log"
        self.env = {**os.environ, "DATABASE_URL": database_url(), "GPUAAS_VAR_DIR": str(tmp_path / "var")}
        self.started: list[subprocess.Popen] = []

    def argv(self) -> list[str]:
        return [sys.executable, "manage.py", "ingest-worker", "--batch", "1", "--linger-ms", "0", "-v", "0"]


@pytest.fixture
def ingest(tmp_path):
    """An ingest worker (started by the test's loop with ensure_running), killed and its queue purged at the end."""
    from capacity.agent import transport

    transport.purge()
    worker = Ingest(tmp_path)
    yield worker
    worker.stop()
    transport.purge()


def drive(workers: Workers, done, *sweeps) -> bool:
    """Keep one worker alive and run the sweeps (as beat would) until done() or the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if done():
            return True
        workers.ensure_running()
        for sweep in sweeps:
            sweep()
        time.sleep(0.5)
    return done()
