"""Rolling driver upgrades with reservations kept: waves of drains handed to the GPU Operator's upgrade controller.

The controller (ClusterPolicy spec.driver.upgradePolicy: autoUpgrade, maxParallelUpgrades, maxUnavailable,
drain, podDeletion; NVIDIA/gpu-operator api/nvidia/v1/clusterpolicy_types.go) walks each node through the
states of its label nvidia.com/gpu-driver-upgrade-state (NVIDIA/k8s-operator-libs pkg/upgrade/consts.go):
upgrade-required, cordon-required, wait-for-jobs-required, pod-deletion-required, drain-required,
pod-restart-required, validation-required, uncordon-required, then upgrade-done, or upgrade-failed. It knows
nothing of reservations. gpuaas therefore drains and moves a node first (operations/maintenance), and only
at the drain's handover sets the label to upgrade-required: the controller finds the node empty of GPU pods,
and its upgrade-done gives the node back. A wave is at most maxParallelUpgrades nodes whose reservations the
free reserve absorbs together (the take-offline check over the wave), so no reservation is ever short.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from capacity.choices import DrainStep as Step
from capacity.choices import ReconfigurationEvent as Event
from capacity.models import NodeCapacity, NodeDrain
from capacity.services import mig_configs
from operations.models import DriverUpgradeNode
from operations.reconfiguration.outcomes import Wait

from .check import take_offline_check
from .records import audit

UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_REQUIRED = "upgrade-required"
UPGRADE_DONE = "upgrade-done"
UPGRADE_FAILED = "upgrade-failed"


def hand_over(drain: NodeDrain, now: datetime) -> Wait | None:
    """At handover: ask the controller to upgrade the node (label upgrade-required, once), then follow its
    state. None once it says upgrade-done (give_back_at is set); Wait while it works or after upgrade-failed
    (the node stays cordoned in maintenance: its reservations are already elsewhere, the operator decides)."""
    with mig_configs.client_for(drain.cluster) as client:
        state = client.get_node(drain.node.name).labels.get(UPGRADE_STATE_LABEL, "")
        if state in ("", UPGRADE_DONE) and not drain.steps.filter(step=Step.HANDOVER, detail__upgrade=True).exists():
            client.patch_node_labels(drain.node.name, {UPGRADE_STATE_LABEL: UPGRADE_REQUIRED})
            audit(
                drain, Step.HANDOVER, Event.INFO, f"{UPGRADE_STATE_LABEL}={UPGRADE_REQUIRED}", detail={"upgrade": True}
            )
            return Wait(f"handed to the driver upgrade controller ({UPGRADE_STATE_LABEL}={UPGRADE_REQUIRED})")
    if state == UPGRADE_DONE:
        with transaction.atomic():
            if NodeDrain.objects.filter(pk=drain.pk, give_back_at__isnull=True).update(give_back_at=now):
                audit(drain, Step.HANDOVER, Event.INFO, "given back by the driver upgrade controller (upgrade-done)")
        return None
    if state == UPGRADE_FAILED:
        if not drain.steps.filter(step=Step.HANDOVER, detail__upgrade_failed=True).exists():
            audit(
                drain,
                Step.HANDOVER,
                Event.INFO,
                f"{UPGRADE_STATE_LABEL}={UPGRADE_FAILED}",
                detail={"upgrade_failed": True},
            )
        return Wait(
            f"the driver upgrade failed ({UPGRADE_STATE_LABEL}={UPGRADE_FAILED}): the node stays in maintenance"
        )
    return Wait(f"driver upgrade in progress: {UPGRADE_STATE_LABEL}={state or 'unset'}")


def wave_siblings(drain: NodeDrain) -> set[int]:
    """The other nodes of `drain`'s rollout wave (operations.models.DriverUpgradeNode): a reservation moved off
    one node of a wave must not land on another node of the same wave, which goes down next."""
    row = DriverUpgradeNode.objects.filter(drain=drain).values("rollout_id", "wave").first()
    if row is None or row["wave"] is None:
        return set()
    siblings = DriverUpgradeNode.objects.filter(rollout_id=row["rollout_id"], wave=row["wave"])
    return set(siblings.exclude(node_id=drain.node_id).values_list("node_id", flat=True))


def next_wave(candidates, *, max_parallel: int) -> list[NodeCapacity]:
    """The next wave: up to `max_parallel` of `candidates` (in order) whose reservations the free reserve
    absorbs all together (take_offline_check over the wave). A node that cannot go even alone is skipped
    (its shortfall is the take-offline check's); [] when none can go now."""
    wave: list[NodeCapacity] = []
    for node in candidates:
        if len(wave) == max_parallel:
            break
        if take_offline_check(nodes=[*wave, node]).covered:
            wave.append(node)
    return wave


def start_wave(nodes, *, reason: str = "driver upgrade", grace_s: int | None = None, actor=None) -> list[NodeDrain]:
    """Start one drain per node of a wave (next_wave), each handed to the upgrade controller at handover."""
    from .lifecycle import start  # cycle: lifecycle imports the steps, which import this module

    return [start(n, reason=reason, grace_s=grace_s, driver_upgrade=True, actor=actor) for n in nodes]
