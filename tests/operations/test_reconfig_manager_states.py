"""What nvidia.com/mig.config.state means to apply and verify: only `success` goes on, only `failed` stops.

Any other value (unset, pending, rebooting, or one the MIG manager never writes) waits, and verify refuses a
nvidia.com/mig.config label other than the reconfiguration's own, whichever way the two names sort.
"""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone
from reconfig_sim import node_row, start_sim

from capacity.adapters import kubernetes as kube
from capacity.models import MigReconfigurationStep
from capacity.services import mig_configs
from operations import reconfiguration as rc
from operations.reconfiguration import steps
from operations.reconfiguration.outcomes import ReconfigurationError, Wait
from operations.tasks import reconfiguration_step_task

pytestmark = pytest.mark.django_db

STATE = mig_configs.MIG_STATE_LABEL
CONFIG = mig_configs.MIG_CONFIG_LABEL


def test_apply_goes_on_only_on_success_and_stops_only_on_failed():
    reconf = SimpleNamespace(config_name="gpuaas-r41", node=SimpleNamespace(name="gpu-b7"))

    assert steps.mig_manager_outcome(reconf, "success") is None
    waits = {state: steps.mig_manager_outcome(reconf, state) for state in ("", "pending", "rebooting", "unknown")}
    assert waits == {
        "": Wait(f"{STATE}=unset"),
        "pending": Wait(f"{STATE}=pending"),
        "rebooting": Wait("the MIG manager is rebooting gpu-b7 to change the MIG mode; waiting for it"),
        "unknown": Wait(f"{STATE}=unknown"),
    }
    with pytest.raises(ReconfigurationError) as failed:
        steps.mig_manager_outcome(reconf, "failed")
    assert str(failed.value) == f"the GPU Operator MIG manager failed to apply gpuaas-r41 ({STATE}=failed)"


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(
        tmp_path,
        [
            ("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, ""),
            ("gpu-b", "H100-80GB", 1, {0: ["7g.80gb"]}, ""),
        ],
    )
    yield sim
    sim.server.stop()


def test_verify_waits_for_success_and_refuses_a_config_label_someone_else_set(sim):
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"], "1": ["7g.80gb"]}, force=True)
    for step in ("plan", "check", "cordon", "drain"):
        assert reconfiguration_step_task(reconf.pk, step) == "advanced"
    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    sim.run_mig_manager()
    assert reconfiguration_step_task(reconf.pk, "apply") == "advanced"
    reconf.refresh_from_db()
    ours = reconf.config_name
    assert ours == f"gpuaas-r{reconf.pk}"

    with mig_configs.client_for(reconf.cluster) as client:
        for state in (None, "", "pending", "rebooting", "unknown"):
            client.patch_node_labels("gpu-a", {STATE: state})
            assert steps.step_verify(reconf, timezone.now()) == Wait(f"{STATE}={state or 'unset'}"), state
        client.patch_node_labels("gpu-a", {STATE: "success"})
        for foreign in ("all-7g.80gb", f"zz-{ours}"):  # one sorts before ours, the other after
            client.patch_node_labels("gpu-a", {CONFIG: foreign})
            with pytest.raises(ReconfigurationError) as changed:
                steps.step_verify(reconf, timezone.now())
            assert str(changed.value) == f"{CONFIG} is {foreign!r}, not {ours!r}: someone changed it"
    assert sim.node("gpu-b").labels.get(CONFIG) != ours  # the other node was never touched


def test_advertised_mismatch_names_each_resource_the_node_gets_wrong(sim):
    # gpu-b: one GPU with a 7g.80gb instance (sim), whatever gpu-a advertises.
    reconf = SimpleNamespace(node=node_row("gpu-b"), plan={"product": "H100-80GB"})
    mixed = {"nvidia.com/mig.strategy": "mixed"}
    seven, one = "nvidia.com/mig-7g.80gb", "nvidia.com/mig-1g.10gb"

    def mismatch(labels, capacity):
        return steps.advertised_mismatch(reconf, SimpleNamespace(labels=labels, capacity=capacity))

    assert mismatch(mixed, {seven: "1", "nvidia.com/gpu": "0"}) == {}
    assert mismatch(mixed, {}) == {seven: (0, 1)}
    assert mismatch(mixed, {seven: "1", one: "3"}) == {one: (3, 0)}
    assert mismatch({"nvidia.com/mig.strategy": "single"}, {}) == {}


def test_agent_verify_waits_naming_the_placements_rediscovery_shows(sim):
    node = node_row("gpu-a")
    planned = [{"profile": "7g.80gb", "start": 0, "size": 8}]
    reconf = SimpleNamespace(
        backend="agent",
        node=node,
        cluster=node.cluster,
        cluster_id=node.cluster_id,
        plan={"product": "H100-80GB", "gpus": {"0": {"mig": True, "placements": planned}}},
    )

    outcome = steps.step_verify(reconf, timezone.now())

    assert outcome.message == ("rediscovery does not show the plan yet: GPU 0: 3g.40gb@0,3g.40gb@4, planned 7g.80gb@0")


@pytest.mark.parametrize(
    "planned, waits",
    [
        ([("7g.80gb", 0)], True),  # other profiles than planned
        ([("3g.40gb", 0)], True),  # more instances than planned
        ([("3g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 6)], True),  # fewer instances than planned
        ([("3g.40gb", 4), ("3g.40gb", 0)], False),  # the planned instances
    ],
)
def test_operator_verify_compares_each_profiles_count_with_the_plan(sim, planned, waits):
    """On the operator path mig-parted chooses the starts, so verify compares profile counts: any difference,
    more or fewer of a profile, waits for another rediscovery."""
    node = node_row("gpu-a")  # GPU 0 shows 3g.40gb@0 and 3g.40gb@4
    placements = [{"profile": profile, "start": start} for profile, start in planned]
    reconf = SimpleNamespace(
        backend="operator",
        node=node,
        node_id=node.pk,
        cluster=node.cluster,
        cluster_id=node.cluster_id,
        config_name="gpuaas-r7",
        applied_at=node.inventory_read_at - timedelta(minutes=1),  # the rows were read after apply
        plan={"product": "H100-80GB", "gpus": {"0": {"mig": True, "placements": placements}}},
    )
    with mig_configs.client_for(node.cluster) as client:
        client.patch_node_labels("gpu-a", {CONFIG: "gpuaas-r7"})  # (the sim's MIG manager fails it)
        client.patch_node_labels("gpu-a", {STATE: "success"})

    if waits:
        outcome = steps.step_verify(reconf, timezone.now())
        assert isinstance(outcome, Wait)
        assert outcome.message.startswith("rediscovery does not show the plan yet: GPU 0: 3g.40gb@0,3g.40gb@4")
    else:
        outcome = steps.step_verify(reconf, timezone.now())
        assert outcome.message == "rediscovery shows the planned instances"


def test_evicting_skips_pods_already_gone_and_reports_the_ones_a_budget_blocks():
    evicted = []

    def evict_pod(namespace, name, grace_period_s):
        if name == "gone":
            raise kube.NotFound("pods gone not found", status=404)
        if name == "guarded":
            raise kube.TooManyRequests("disruption budget", status=429)
        evicted.append((namespace, name))

    pods = [
        SimpleNamespace(namespace="team-a", name=name, deleted=name == "deleting")
        for name in ("gone", "train-0", "deleting", "guarded", "train-1")
    ]

    blocked = steps.evict_pods(SimpleNamespace(evict_pod=evict_pod), pods)

    assert blocked == ["team-a/guarded"]
    assert evicted == [("team-a", "train-0"), ("team-a", "train-1")]


def test_the_plan_step_records_the_slots_before_and_after(sim):
    """gpu-a's GPU 0 (two 3g.40gb) becomes one 7g.80gb: the plan's audit row names the slots on both sides."""
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"]}, force=True)
    assert reconfiguration_step_task(reconf.pk, "plan") == "advanced"

    completed = MigReconfigurationStep.objects.get(reconfiguration=reconf, step="plan", event="completed")
    assert completed.detail == {"slots_before": {"3g.40gb": 2}, "slots_after": {"7g.80gb": 1}}


def test_config_name_is_the_named_config_asked_for_only_on_a_first_attempt_that_changes_the_label():
    named = next(iter(mig_configs.named_config_entries()))
    reconf = SimpleNamespace(pk=41, source=named, attempts=0, layout=None, target={})

    assert steps.config_name_for(reconf, current_label="gpuaas-r7") == named
    assert steps.config_name_for(reconf, current_label=named) == "gpuaas-r41"  # the label must change
    reconf.attempts = 2
    assert steps.config_name_for(reconf, current_label="gpuaas-r41-1") == "gpuaas-r41-2"
    assert steps.config_name_for(reconf, current_label=named) == "gpuaas-r41-2"


@pytest.mark.parametrize(
    ("was_cordoned", "why"),
    [(True, "it was cordoned before gpuaas started"), (None, "gpuaas never cordoned it")],
)
def test_uncordon_leaves_a_node_gpuaas_did_not_cordon_and_says_why(was_cordoned, why):
    row = SimpleNamespace(was_cordoned=was_cordoned, refresh_from_db=lambda fields: None)

    assert steps.uncordon_node(row).message == f"node left as it was ({why})"
