"""MIG reconfigurations whose node queue is served by a real node agent with no database.

The control-plane worker (with DATABASE_URL) serves `default`, where every step runs; the node agent
(GPUAAS_ROLE=node-agent, DATABASE_URL unset, holding only gpu-a's key) serves gpu-a's queue: on the
agent backend it carries out the signed MIG command, on both it answers inventory requests, which the
ingest worker writes. On the operator backend the GPU Operator's (simulated) MIG manager changes the
GPUs and verify waits for the agent's inventory read after it: no step runs on the node. In the
agent-backend kill test the agent is SIGKILLed after applying and before sending its result: the
result is lost, the control plane sends the command again after MIG_AGENT_RESEND_S, the restarted
agent finds the layout in place (nothing applied twice) and answers.
"""

from __future__ import annotations

import time

import pytest
from conftest import DEADLINE_S, Agent, purge
from reconfig_sim import node_row, start_sim

from operations import reconfiguration as rc

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def _run(tmp_path, workers, ingest, *, backend: str = "agent", crash_at: str = "", resend_s: int = 120):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")], mig_manager_delay=0.2)
    agent = Agent(tmp_path, sim.cluster.name, "gpu-a", crash_at)
    purge([agent.queue])
    fleet = workers(["default"], [])
    fleet.env["MIG_AGENT_RESEND_S"] = str(resend_s)
    try:
        reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"], "1": ["2g.20gb"] * 3}, backend=backend, force=True)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            reconf.refresh_from_db()
            if reconf.state in ("succeeded", "failed"):
                break
            agent.ensure_running()
            ingest.ensure_running()
            fleet.ensure_running()
            rc.sweep()
            time.sleep(0.5)
    finally:
        agent.stop()
        purge([agent.queue])
        sim.server.stop()
    logs = (agent.log.read_text()[-3000:], ingest.log.read_text()[-3000:], fleet.log_tail())
    assert reconf.state == "succeeded", (reconf.error, *logs)
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert [profile for profile, _ in sim.layout("gpu-a", 1)] == ["2g.20gb"] * 3
    assert sim.db_layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert sim.node("gpu-a").unschedulable is False
    assert "ImproperlyConfigured" not in agent.log.read_text()
    return reconf, agent


def test_a_node_agent_without_a_database_serves_a_whole_agent_backend_reconfiguration(tmp_path, workers, ingest):
    reconf, agent = _run(tmp_path, workers, ingest)
    completed = list(reconf.steps.filter(event="completed").order_by("at", "id").values_list("step", flat=True))
    assert completed == ["plan", "check", "cordon", "drain", "apply", "verify", "uncordon"]
    assert len(agent.started) == 1


def test_a_result_lost_with_its_agent_is_recovered_by_sending_the_command_again(tmp_path, workers, ingest):
    reconf, agent = _run(tmp_path, workers, ingest, crash_at="agent.mig", resend_s=3)
    assert [p.returncode for p in agent.started[:-1]] == [-9]  # killed after applying, before answering
    assert reconf.steps.filter(step="apply", message__contains="re-sent to the node agent").exists()
    applied = reconf.steps.get(step="apply", event="completed").detail["applied"]
    assert applied["0"] == {"destroyed": [], "created": [], "kept": ["7g.80gb@0"]}  # nothing applied twice


def test_an_operator_backend_reconfiguration_needs_only_inventory_reads_from_a_node_agent_without_a_database(
    tmp_path, workers, ingest
):
    reconf, agent = _run(tmp_path, workers, ingest, backend="operator")
    completed = list(reconf.steps.filter(event="completed").order_by("at", "id").values_list("step", flat=True))
    assert completed == ["plan", "check", "cordon", "drain", "apply", "verify", "uncordon"]
    assert all(s.task_id not in ("", "local") for s in reconf.steps.filter(event="completed"))
    assert len(agent.started) == 1
    assert "unregistered task" not in agent.log.read_text().lower()  # nothing but agent tasks reached it
    # verify read the agent's inventory, read after the MIG manager's success (that read's rows are in the DB)
    assert node_row("gpu-a").inventory_read_since(reconf.applied_at)
    assert reconf.config_name == f"gpuaas-r{reconf.pk}"
