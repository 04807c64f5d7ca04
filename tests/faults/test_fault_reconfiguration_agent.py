"""An agent-backend MIG reconfiguration whose node queue is served by a real node agent with no database.

The control-plane worker (with DATABASE_URL) serves `default`, where every step runs; the node agent
(GPUAAS_ROLE=node-agent, DATABASE_URL unset, holding only gpu-a's key) serves gpu-a's queue and only
carries out the signed MIG command. In the second test the agent is SIGKILLed after applying and
before sending its result: the result is lost, the control plane sends the command again after
MIG_AGENT_RESEND_S, the restarted agent finds the layout in place (nothing applied twice) and answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import DEADLINE_S, REPO, purge
from django.conf import settings
from reconfig_sim import node_row, start_sim

from capacity.agent import protocol
from gpuaas.celery import node_queue
from operations import reconfiguration as rc

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


class Agent:
    """One node-agent process for `node` (restarted when it dies, as its DaemonSet would)."""

    def __init__(self, tmp_path, cluster: str, node: str, crash_at: str = ""):
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

    def ensure_running(self) -> None:
        if self.started and self.started[-1].poll() is None:
            return
        log = open(self.log, "ab")  # noqa: SIM115 - closed with the process
        self.started.append(
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "gpuaas", "worker", "-P", "solo", "-l", "WARNING"]
                + ["-Q", self.queue, "-n", f"agent{len(self.started)}@localhost"]
                + ["--without-heartbeat", "--without-gossip", "--without-mingle"],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def _run(tmp_path, workers, *, crash_at: str = "", resend_s: int = 120):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")], mig_manager_delay=0.2)
    agent = Agent(tmp_path, sim.cluster.name, "gpu-a", crash_at)
    purge([agent.queue])
    fleet = workers(["default"], [])
    fleet.env["MIG_AGENT_RESEND_S"] = str(resend_s)
    try:
        reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"], "1": ["2g.20gb"] * 3}, backend="agent", force=True)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            reconf.refresh_from_db()
            if reconf.state in ("succeeded", "failed"):
                break
            agent.ensure_running()
            fleet.ensure_running()
            rc.sweep()
            time.sleep(0.5)
    finally:
        agent.stop()
        purge([agent.queue])
        sim.server.stop()
    assert reconf.state == "succeeded", (reconf.error, agent.log.read_text()[-3000:], fleet.log_tail())
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert [profile for profile, _ in sim.layout("gpu-a", 1)] == ["2g.20gb"] * 3
    assert sim.db_layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert sim.node("gpu-a").unschedulable is False
    assert "ImproperlyConfigured" not in agent.log.read_text()
    return reconf, agent


def test_a_node_agent_without_a_database_serves_a_whole_agent_backend_reconfiguration(tmp_path, workers):
    reconf, agent = _run(tmp_path, workers)
    completed = list(reconf.steps.filter(event="completed").order_by("at", "id").values_list("step", flat=True))
    assert completed == ["plan", "check", "cordon", "drain", "apply", "verify", "uncordon"]
    assert len(agent.started) == 1


def test_a_result_lost_with_its_agent_is_recovered_by_sending_the_command_again(tmp_path, workers):
    reconf, agent = _run(tmp_path, workers, crash_at="agent.mig", resend_s=3)
    assert [p.returncode for p in agent.started[:-1]] == [-9]  # killed after applying, before answering
    assert reconf.steps.filter(step="apply", message__contains="re-sent to the node agent").exists()
    applied = reconf.steps.get(step="apply", event="completed").detail["applied"]
    assert applied["0"] == {"destroyed": [], "created": [], "kept": ["7g.80gb@0"]}  # nothing applied twice
