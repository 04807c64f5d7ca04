"""Rolling driver/firmware upgrades: creating a rollout and the operator's verbs on it.

A DriverUpgrade (operations.models) upgrades a set of a cluster's nodes (every GPU node, a node group or a
list) in waves: each wave is at most `max_parallel` nodes whose reservations the free reserve absorbs
together (upgrades.next_wave, the reserve rule of take_offline_check), started only while a maintenance
window is open for its nodes (capacity MaintenanceWindow.objects.for_node(node).open_at(t)). Each node of
a wave is drained and moved (lifecycle.start, a NodeDrain) and then upgraded:

- mode `controller`: the GPU Operator's upgrade controller (ClusterPolicy spec.driver.upgradePolicy
  autoUpgrade true) gets the node at the drain's handover (label nvidia.com/gpu-driver-upgrade-state =
  upgrade-required, upgrades.hand_over) and gives it back at upgrade-done;
- mode `own_drain` (controller off): the operator upgrades the node and gives it back (give_back_node, or
  the drain's give-back), after which the drain waits for it to be Ready with every GPU healthy.

max_parallel defaults to the ClusterPolicy's `spec.driver.upgradePolicy.maxParallelUpgrades` (NVIDIA/
gpu-operator api/nvidia/v1/clusterpolicy_types.go, DriverUpgradePolicySpec: default 1, 0 = no limit) read
through the Kubernetes adapter, else DRIVER_UPGRADE_MAX_PARALLEL. The tick that drives a rollout is
rollout_tick.tick (operations.tasks.driver_upgrade_tick_task). Docs: docs/maintenance.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.models import Cluster, NodeCapacity
from capacity.services import mig_configs
from operations.choices import UpgradeMode, UpgradeNodeState, UpgradeState
from operations.models import OPEN_STATES, DriverUpgrade, DriverUpgradeNode
from operations.reconfiguration.outcomes import IllegalTransition
from operations.reconfiguration.records import user_or_none
from policies import policy

from .lifecycle import give_back


@dataclass(frozen=True)
class Defaults:
    max_parallel: int
    source: str  # "ClusterPolicy <name>" or "setting DRIVER_UPGRADE_MAX_PARALLEL"
    mode: str


def defaults_for(cluster: Cluster, node_count: int) -> Defaults:
    """max_parallel and mode from the cluster's ClusterPolicy (maxParallelUpgrades, 0 = every node at once;
    autoUpgrade picks the controller), else the setting and own_drain. A cluster that cannot be asked (down,
    no CRD) falls back to the setting."""
    try:
        with mig_configs.client_for(cluster) as client:
            policy = client.driver_upgrade_policy()
    except kube.KubernetesError:
        policy = None
    if policy is None:
        return Defaults(
            settings.DRIVER_UPGRADE_MAX_PARALLEL, "setting DRIVER_UPGRADE_MAX_PARALLEL", UpgradeMode.OWN_DRAIN
        )
    parallel = policy.max_parallel_upgrades or max(node_count, 1)
    mode = UpgradeMode.CONTROLLER if policy.auto_upgrade else UpgradeMode.OWN_DRAIN
    return Defaults(parallel, f"ClusterPolicy {policy.policy_name}"[:40], mode)


def select_nodes(cluster: Cluster, *, nodes=None, node_group: str = "") -> list[NodeCapacity]:
    """The rollout's nodes, in name order: `nodes` (rows or pks of this cluster), else the node group's GPU
    nodes, else every present GPU node of the cluster. ValidationError (field-keyed) when the choice is empty
    or names a node elsewhere."""
    present = NodeCapacity.objects.present().filter(cluster=cluster)
    if nodes:
        ids = {getattr(n, "pk", n) for n in nodes}
        chosen = list(present.filter(pk__in=ids).order_by("name"))
        missing = ids - {n.pk for n in chosen}
        if missing:
            raise ValidationError({"nodes": f"not present nodes of {cluster}: {sorted(missing)}"})
        if node_group and any(n.node_group != node_group for n in chosen):
            raise ValidationError({"node_group": "give a node group or a list of nodes, not both"})
        return chosen
    chosen = present.filter(gpu_count__gt=0)
    if node_group:
        chosen = chosen.filter(node_group=node_group)
    chosen = list(chosen.order_by("name"))
    if not chosen:
        field = "node_group" if node_group else "cluster"
        raise ValidationError(
            {field: f"no GPU nodes to upgrade in {cluster}" + (f"/{node_group}" if node_group else "")}
        )
    return chosen


def create(
    cluster: Cluster,
    *,
    nodes=None,
    node_group: str = "",
    name: str = "",
    mode: str | None = None,
    max_parallel: int | None = None,
    grace_s: int | None = None,
    actor=None,
) -> DriverUpgrade:
    """Create a rollout over the chosen nodes (select_nodes) and send its first tick after commit.

    ValidationError (field-keyed, nothing written) when the selection is empty or a node already belongs to
    an open rollout; max_parallel and mode default as defaults_for() says."""
    chosen = select_nodes(cluster, nodes=nodes, node_group=node_group)
    busy = list(
        DriverUpgradeNode.objects.filter(node__in=chosen, rollout__state__in=OPEN_STATES)
        .select_related("node")
        .order_by("node__name")
    )
    if busy:
        names = ", ".join(f"{b.node.name} (upgrade #{b.rollout_id})" for b in busy)
        raise ValidationError({"nodes": f"already in an open rollout: {names}"})
    found = defaults_for(cluster, len(chosen)) if (mode is None or max_parallel is None) else None
    source = "given" if max_parallel is not None else found.source
    now = timezone.now()
    with transaction.atomic():
        rollout = DriverUpgrade.objects.create(
            cluster=cluster,
            name=name,
            node_group=node_group,
            mode=mode or found.mode,
            max_parallel=max_parallel if max_parallel is not None else found.max_parallel,
            max_parallel_source=source,
            grace_s=policy("MAINTENANCE_GRACE_S") if grace_s is None else grace_s,
            tick_due_at=now,
            created_by=user_or_none(actor),
        )
        DriverUpgradeNode.objects.bulk_create(
            DriverUpgradeNode(rollout=rollout, node=node, position=n) for n, node in enumerate(chosen)
        )
        poke(rollout)
    return rollout


def poke(rollout: DriverUpgrade) -> None:
    """Make the next tick due now and send it after commit (a stale chained tick then finds itself early)."""
    from operations.tasks import enqueue_driver_upgrade_tick  # cycle: operations.tasks imports this package

    DriverUpgrade.objects.filter(pk=rollout.pk).update(tick_due_at=timezone.now())
    pk = rollout.pk
    transaction.on_commit(lambda: enqueue_driver_upgrade_tick(pk))


def _transition(rollout: DriverUpgrade, allowed: tuple, new: str, verb: str) -> DriverUpgrade:
    with transaction.atomic():
        if DriverUpgrade.objects.filter(pk=rollout.pk, state__in=allowed).update(state=new) != 1:
            rollout.refresh_from_db()
            raise IllegalTransition(f"upgrade #{rollout.pk} is {rollout.state}: it cannot be {verb}")
        poke(rollout)
    rollout.refresh_from_db()
    return rollout


def pause(rollout: DriverUpgrade, *, actor=None) -> DriverUpgrade:
    """No new wave starts; the nodes already out finish (their drains and upgrades go on)."""
    return _transition(rollout, (UpgradeState.PENDING, UpgradeState.RUNNING), UpgradeState.PAUSED, "paused")


def resume(rollout: DriverUpgrade, *, actor=None) -> DriverUpgrade:
    return _transition(rollout, (UpgradeState.PAUSED,), UpgradeState.RUNNING, "resumed")


def cancel(rollout: DriverUpgrade, *, actor=None) -> DriverUpgrade:
    """No node not yet started will be; the nodes already out are followed until they are back or failed."""
    open_states = tuple(OPEN_STATES)
    return _transition(rollout, open_states, UpgradeState.CANCELLED, "cancelled")


def give_back_node(rollout: DriverUpgrade, node: NodeCapacity, *, actor=None, note: str = "") -> DriverUpgrade:
    """own_drain mode: the operator upgraded `node`; give it back (its drain's give_back, then health)."""
    row = DriverUpgradeNode.objects.filter(rollout=rollout, node=node).select_related("drain").first()
    if row is None or row.drain is None or row.state != UpgradeNodeState.UPGRADING:
        state = "not in this rollout" if row is None else row.state
        raise IllegalTransition(f"{node} is {state}: only a node handed over for its upgrade can be given back")
    with transaction.atomic():
        give_back(row.drain, actor=actor, note=note or f"upgraded (upgrade #{rollout.pk})")
        poke(rollout)
    rollout.refresh_from_db()
    return rollout
