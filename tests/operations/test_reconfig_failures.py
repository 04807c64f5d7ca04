"""Every step can fail; the reconfiguration stops there with the node cordoned, and resumes or rolls back."""

from datetime import timedelta

import pytest
from django.utils import timezone
from reconfig_sim import drive, node_row, serve_agent, start_sim

from capacity.adapters import kubernetes as kube
from capacity.adapters import nvml
from capacity.models import MigReconfiguration
from operations import reconfiguration as rc
from operations.reconfiguration import commands
from operations.tasks import reconfiguration_step_task
from simcluster import hardware

pytestmark = pytest.mark.django_db


class WorkerKilled(BaseException):
    """Stands for SIGKILL of the worker: not an Exception, so nothing in the step catches it."""


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


def run_until(reconf, step):
    """Run the steps before `step`."""
    for name in rc.ORDER[: rc.ORDER.index(step)]:
        if name == "apply" and reconf.backend == "agent":
            assert reconfiguration_step_task(reconf.pk, name) == "waiting"
            assert serve_agent(reconf) == "recorded"
        assert reconfiguration_step_task(reconf.pk, name) == "advanced", name


def events(reconf):
    return [(s.step, s.event) for s in reconf.steps.order_by("at", "id")]


def test_operator_apply_fails_then_resumes_with_a_fresh_config_name(sim):
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"], "1": ["7g.80gb"]}, force=True)
    run_until(reconf, "apply")
    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    sim.state.faults.gpu_lost(sim.cluster.name, "gpu-a", 1)
    sim.run_mig_manager()

    assert reconfiguration_step_task(reconf.pk, "apply") == "failed"
    reconf.refresh_from_db()
    assert (reconf.state, reconf.step, reconf.failed_step) == ("failed", "apply", "apply")
    assert reconf.error == (
        f"the GPU Operator MIG manager failed to apply gpuaas-r{reconf.pk} (nvidia.com/mig.config.state=failed)"
    )
    assert sim.node("gpu-a").unschedulable is True  # left cordoned
    assert sim.layout("gpu-a", 0) == [("3g.40gb", 0), ("3g.40gb", 4)]  # the manager changed nothing

    sim.state.faults.reset()
    rc.resume(reconf)
    outcomes = drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert outcomes[0] == "apply:waiting"
    assert reconf.config_name == f"gpuaas-r{reconf.pk}-1"
    assert reconf.attempts == 1
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert sim.node("gpu-a").unschedulable is False
    trail = events(reconf)
    assert trail.index(("apply", "failed")) < trail.index(("apply", "resumed")) < trail.index(("apply", "completed"))


def test_nvml_insufficient_resources_fails_apply_and_resume_finishes(sim, monkeypatch):
    original = hardware.Gpu.create_gpu_instance
    calls = []

    def refuse_first(self, profile, start=None, **kwargs):
        calls.append((profile.name, start))
        if len(calls) == 1:
            raise hardware.HardwareError(hardware.NVML_ERROR_INSUFFICIENT_RESOURCES, "placement busy")
        return original(self, profile, start, **kwargs)

    monkeypatch.setattr(hardware.Gpu, "create_gpu_instance", refuse_first)
    reconf = rc.create(node_row("gpu-a"), {"0": ["4g.40gb", "3g.40gb"]}, backend="agent", force=True)
    run_until(reconf, "apply")

    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    assert serve_agent(reconf) == "recorded"
    assert reconfiguration_step_task(reconf.pk, "apply") == "failed"
    reconf.refresh_from_db()
    assert reconf.error == ("NVML: GPU 0: creating GPU instance 4g.40gb@0: Insufficient Resources (NVML error 23)")
    assert sim.node("gpu-a").unschedulable is True
    assert sim.layout("gpu-a", 0) == [("3g.40gb", 4)]  # half done, and the failure says where

    monkeypatch.setattr(hardware.Gpu, "create_gpu_instance", original)
    rc.resume(reconf)
    drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert sim.layout("gpu-a", 0) == [("4g.40gb", 0), ("3g.40gb", 4)]
    applied = reconf.steps.get(step="apply", event="completed").detail["applied"]["0"]
    assert applied == {"destroyed": [], "created": ["4g.40gb@0"], "kept": ["3g.40gb@4"]}


def test_verify_times_out_when_rediscovery_never_shows_the_plan(sim, monkeypatch):
    # discovery lags: the rows stay as they were (the result's read-back inventory is not written)
    monkeypatch.setattr(commands, "ingest_inventory_reports", lambda reports: ({}, []))
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"]}, backend="agent", force=True)
    run_until(reconf, "verify")

    assert reconfiguration_step_task(reconf.pk, "verify") == "waiting"
    reconf.refresh_from_db()
    assert reconf.state == "waiting"
    MigReconfiguration.objects.filter(pk=reconf.pk).update(step_deadline=timezone.now() - timedelta(seconds=1))
    assert reconfiguration_step_task(reconf.pk, "verify") == "failed"
    reconf.refresh_from_db()
    assert reconf.error == (
        "timed out after 300 s: rediscovery does not show the plan yet: GPU 0: 3g.40gb@0,3g.40gb@4, planned 7g.80gb@0"
    )
    assert sim.node("gpu-a").unschedulable is True

    monkeypatch.undo()
    sim.discover()  # the agent's next inventory read arrives
    rc.resume(reconf)
    drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error
    assert sim.db_layout("gpu-a", 0) == [("7g.80gb", 0)]


def test_node_vanishing_fails_the_step_and_resume_carries_on_when_it_is_back(sim):
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    run_until(reconf, "cordon")
    sim.state.faults.node_vanish(sim.cluster.name, "gpu-a")

    assert reconfiguration_step_task(reconf.pk, "cordon") == "failed"
    reconf.refresh_from_db()
    assert reconf.failed_step == "cordon"
    assert reconf.error.startswith("gpu-a or an object it needs is gone from the cluster: read_node on ")
    assert "404" in reconf.error

    sim.state.faults.reset()
    rc.resume(reconf)
    drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error
    assert sim.layout("gpu-a", 1) == [("7g.80gb", 0)]


def test_agent_killed_in_apply_is_re_entered_by_the_redelivered_command(sim, monkeypatch):
    real = nvml.apply_gpu_layout
    done = []

    def die_on_second_gpu(session, index, product, **kwargs):
        if done:
            raise WorkerKilled
        done.append(index)
        return real(session, index, product, **kwargs)

    monkeypatch.setattr(nvml, "apply_gpu_layout", die_on_second_gpu)
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"], "1": ["2g.20gb", "2g.20gb"]}, backend="agent", force=True)
    run_until(reconf, "apply")
    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    with pytest.raises(WorkerKilled):  # the agent dies mid-command: no result
        serve_agent(reconf)
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]  # GPU 0 done, GPU 1 not yet
    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"

    monkeypatch.setattr(nvml, "apply_gpu_layout", real)
    assert serve_agent(reconf) == "recorded"  # the same command, redelivered
    assert serve_agent(reconf) == "duplicate"  # once more: nothing applied or stored twice
    drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert sim.layout("gpu-a", 1) == [("2g.20gb", 0), ("2g.20gb", 2)]
    applied = reconf.steps.get(step="apply", event="completed").detail["applied"]
    assert applied["0"] == {"destroyed": [], "created": [], "kept": ["7g.80gb@0"]}


def test_a_lost_command_is_sent_again_after_the_resend_interval(sim, settings, django_capture_on_commit_callbacks):
    settings.MIG_AGENT_RESEND_S = 0
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"]}, backend="agent", force=True)
    run_until(reconf, "apply")
    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    assert reconf.steps.filter(step="apply", message__contains="re-sent to the node agent").exists()
    assert serve_agent(reconf) == "recorded"
    assert reconfiguration_step_task(reconf.pk, "apply") == "advanced"


def test_worker_killed_after_setting_the_label_does_not_set_it_twice(sim, monkeypatch):
    real = kube.KubernetesClient.patch_node_labels
    patches = []

    def patch_then_die(self, name, labels):
        patches.append(labels)
        real(self, name, labels)
        if len(patches) == 1:
            raise WorkerKilled

    monkeypatch.setattr(kube.KubernetesClient, "patch_node_labels", patch_then_die)
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    run_until(reconf, "apply")
    with pytest.raises(WorkerKilled):
        reconfiguration_step_task(reconf.pk, "apply")

    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"  # re-entered: label already there
    sim.run_mig_manager()
    drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert len(patches) == 1
    assert sim.layout("gpu-a", 1) == [("7g.80gb", 0)]


def test_sweep_returns_a_dead_workers_step_and_resends_lost_messages(
    sim, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(reconfiguration_step_task, "apply_async", lambda args, **options: sent.append(args))
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    MigReconfiguration.objects.filter(pk=reconf.pk).update(
        state="running", claim_token="dead-task", claimed_at=timezone.now()
    )
    later = timezone.now() + timedelta(hours=1)

    with django_capture_on_commit_callbacks(execute=True):
        result = rc.sweep(now=later)

    reconf.refresh_from_db()
    assert result == {"stale_claims": 1, "requeued": 1}  # the freed step is also seen as idle
    assert (reconf.state, reconf.claim_token) == ("pending", "")
    assert sent == [(reconf.pk, "plan"), (reconf.pk, "plan")]
    assert reconf.steps.filter(event="info", message="worker lost (claim dead-task expired); step re-queued").exists()
    assert reconfiguration_step_task(reconf.pk, "plan") == "advanced"
    assert reconfiguration_step_task(reconf.pk, "plan") == "stale"  # the duplicate does nothing


def test_rollback_restores_the_previous_layout_and_uncordons(sim):
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"], "1": ["7g.80gb"]}, backend="agent", force=True)
    run_until(reconf, "verify")
    sim.state.faults.gpu_lost(sim.cluster.name, "gpu-a", 1)
    MigReconfiguration.objects.filter(pk=reconf.pk).update(step_deadline=timezone.now() - timedelta(seconds=1))
    assert reconfiguration_step_task(reconf.pk, "verify") == "failed"
    sim.state.faults.reset()
    sim.discover()  # the next discovery sees GPU 1 back
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]

    back = rc.rollback(reconf)
    drive(sim, back)

    reconf.refresh_from_db()
    assert reconf.state == "rolled_back"
    assert back.rollback_of == reconf
    assert back.force is True
    assert back.state == "succeeded", back.error
    assert sim.layout("gpu-a", 0) == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert sim.node("gpu-a").gpu(1).mig_enabled is False
    assert sim.node("gpu-a").unschedulable is False
    assert back.steps.get(step="uncordon", event="completed").message == "node uncordoned"
    assert ("verify", "rollback") in events(reconf)


def test_drain_gives_up_at_its_deadline_and_leaves_the_node_cordoned(sim):
    sim.add_gpu_pod("gpu-a", "notebook", "nvidia.com/gpu")
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    run_until(reconf, "drain")
    assert reconfiguration_step_task(reconf.pk, "drain") == "waiting"
    MigReconfiguration.objects.filter(pk=reconf.pk).update(step_deadline=timezone.now() - timedelta(seconds=1))

    assert reconfiguration_step_task(reconf.pk, "drain") == "failed"
    reconf.refresh_from_db()
    assert reconf.error == (
        "timed out after 900 s: 1 GPU pod(s) still running, waiting for them to finish (drain not chosen): "
        "team-a/notebook"
    )
    assert sim.node("gpu-a").unschedulable is True
    assert reconf.can_resume and reconf.can_roll_back


def test_steps_that_are_not_current_do_nothing(sim):
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    assert reconfiguration_step_task(reconf.pk, "apply") == "stale"
    assert reconfiguration_step_task(reconf.pk + 1000, "plan") == "gone"
    drive(sim, reconf)
    assert reconfiguration_step_task(reconf.pk, "uncordon") == "stale"
    assert reconf.steps.filter(event="started").count() == 7
