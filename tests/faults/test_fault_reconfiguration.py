"""kill -9 of the worker at each step of a MIG reconfiguration: the sweep carries it through to done."""

import pytest
from conftest import drive
from reconfig_sim import node_row, start_sim

from core.celery import node_queue
from operations import reconfiguration as rc

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

STEPS = [f"reconfiguration.{step}" for step in ("plan", "check", "cordon", "drain", "apply", "verify", "uncordon")]


@pytest.mark.parametrize("backend", ["agent", "operator"])
def test_a_reconfiguration_survives_a_kill_at_every_step(tmp_path, workers, ingest, backend):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")], mig_manager_delay=0.2)
    try:
        fleet = workers(["default", node_queue(sim.cluster.name, "gpu-a")], STEPS)
        reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"], "1": ["2g.20gb"] * 3}, backend=backend, force=True)

        def done():
            reconf.refresh_from_db()
            return reconf.state in ("succeeded", "failed")

        # The ingest worker writes the inventory reads verify asks the node's queue for (served here by the
        # same full workers: only node-agent tasks go there).
        assert drive(fleet, done, rc.sweep, ingest.ensure_running), fleet.log_tail()
    finally:
        sim.server.stop()

    assert reconf.state == "succeeded", reconf.error
    assert fleet.crashed() == sorted(STEPS)
    assert fleet.killed() == [-9] * len(STEPS)
    completed = list(reconf.steps.filter(event="completed").order_by("at", "id").values_list("step", flat=True))
    assert completed == ["plan", "check", "cordon", "drain", "apply", "verify", "uncordon"]
    lost = reconf.steps.filter(event="info", message__startswith="worker lost").values_list("step", flat=True)
    assert sorted(lost) == sorted(["plan", "check", "cordon", "drain", "apply", "verify", "uncordon"])
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert [profile for profile, _ in sim.layout("gpu-a", 1)] == ["2g.20gb"] * 3
    assert sim.node("gpu-a").unschedulable is False
