"""The steps: plan, check, cordon, drain, apply (operator or agent backend), verify, uncordon.

Each takes the reconfiguration and the time and returns Advance or Wait, or raises
ReconfigurationError; the engine claims, runs and records them. Every step is re-entrant: a
redelivered task runs it again over what its first run already did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.choices import ReconfigurationBackend as Backend
from capacity.choices import ReconfigurationEvent as Event
from capacity.choices import ReconfigurationStep as Step
from capacity.mig.catalog import get_product
from capacity.models import GPUAAS_CONFIG_PREFIX, MigReconfiguration, NodeCapacity
from capacity.services import mig_configs
from pools.models import Allocation
from pools.services import rehome_allocations
from pools.signals import AllocationEndCause

from . import commands
from .outcomes import Advance, ReconfigurationError, Refused, Wait
from .plan import (
    GpuPlan,
    affected_gpus,
    assess,
    current_layouts,
    gpu_pods,
    placement_set,
    plan_node,
    profile_counts,
    slot_counts,
)
from .records import audit

# The GPU Operator's device plugin DaemonSet pods, and the label it sets on nodes it runs the MIG manager on.
DEVICE_PLUGIN_APP = "nvidia-device-plugin-daemonset"
MIG_MANAGER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.mig-manager"


def step_plan(reconf: MigReconfiguration, now: datetime) -> Advance:
    node = reconf.node
    if node.is_gone:
        raise ReconfigurationError(f"{node} is gone (discovery no longer sees it)")
    plans = plan_node(node, reconf.target, reconf.backend)
    product = next((p.product for p in plans.values() if p.product), "")
    affected = affected_gpus(node, plans, reconf.backend)
    plan = {
        "product": product,
        "gpus": {str(i): p.to_dict() for i, p in plans.items()},
        "changed": [i for i, p in plans.items() if p.changed],
        "affected": affected,
    }
    updates = {"plan": plan}
    if not reconf.previous:
        updates["previous"] = {
            "config": node.mig_config,
            "gpus": {str(i): {"mig": p.before_mig, "placements": p.before} for i, p in plans.items()},
        }
    detail = {"slots_before": slot_counts(plans, after=False), "slots_after": slot_counts(plans, after=True)}
    if not plan["changed"]:
        return Advance("nothing to change: the GPUs already have the target layout", detail, updates, Step.UNCORDON)
    changes = "; ".join(
        f"GPU {i}: {_describe(plans[i].before_mig, plans[i].before)} -> {_describe(plans[i].after_mig, plans[i].after)}"
        for i in plan["changed"]
    )
    return Advance(changes, detail, updates)


def _describe(mig: bool, placements: list[dict]) -> str:
    if not mig:
        return "MIG off"
    if not placements:
        return "MIG on, empty"
    return ",".join(f"{p['profile']}@{p['start']}" for p in placements)


def step_check(reconf: MigReconfiguration, now: datetime) -> Advance:
    node = NodeCapacity.objects.get(pk=reconf.node_id)
    if node.is_gone:
        raise ReconfigurationError(f"{node} is gone (discovery no longer sees it)")
    plans = {int(k): _gpu_plan(int(k), v, reconf.plan.get("product", "")) for k, v in reconf.plan["gpus"].items()}
    impact = assess(
        node, reconf.target, backend=reconf.backend, drain=reconf.drain, force=reconf.force, now=now, plans=plans
    )
    if impact.refusals:
        raise Refused("; ".join(impact.refusals), {"allocations": [a.pk for a in impact.allocations]})
    with mig_configs.client_for(reconf.cluster) as client:
        client.get_node(node.name)
    notes = []
    if impact.allocations:
        notes.append(f"{len(impact.allocations)} allocation(s) on affected GPUs: their pods will be evicted")
    notes.append("inside a maintenance window" if impact.window_open else "outside maintenance windows (forced)")
    return Advance("; ".join(notes), {"allocations": [a.pk for a in impact.allocations]})


def _gpu_plan(index: int, data: dict, product: str) -> GpuPlan:
    return GpuPlan(index, product, data["before_mig"], data["before"], data["mig"], data["placements"])


def step_cordon(reconf: MigReconfiguration, now: datetime) -> Advance:
    return cordon_node(reconf)


def cordon_node(row) -> Advance:
    """Cordon the row's node (a MigReconfiguration or a NodeDrain: both carry cluster, node and was_cordoned),
    remembering whether it was cordoned before, so that uncordon_node() only undoes our own."""
    with mig_configs.client_for(row.cluster) as client:
        current = client.get_node(row.node.name)
        if row.was_cordoned is None:
            # Recorded before cordoning, so a re-run after a crash cannot mistake our cordon for the operator's.
            type(row).objects.filter(pk=row.pk, was_cordoned__isnull=True).update(was_cordoned=current.unschedulable)
        if current.unschedulable:
            return Advance("the node was already cordoned")
        client.cordon(row.node.name)
    return Advance("node cordoned")


def step_drain(reconf: MigReconfiguration, now: datetime) -> Advance | Wait:
    blocked = []
    with mig_configs.client_for(reconf.cluster) as client:
        client.get_node(reconf.node.name)  # a vanished node has no pods either: do not mistake that for drained
        pods = gpu_pods(client, reconf.node, backend=reconf.backend, affected=reconf.plan.get("affected", []))
        if reconf.drain:
            blocked = evict_pods(client, pods)
            pods = gpu_pods(client, reconf.node, backend=reconf.backend, affected=reconf.plan.get("affected", []))
    if not pods:
        return Advance("no GPU pods left on the affected GPUs")
    how = "evicting" if reconf.drain else "waiting for them to finish (drain not chosen)"
    return pods_left(pods, how, blocked)


def evict_pods(client: kube.KubernetesClient, pods: list[kube.Pod]) -> list[str]:
    """Evict `pods` through the Eviction API (PodDisruptionBudgets respected, MIG_EVICTION_GRACE_S);
    returns the pods a budget blocks. Pods already deleting or gone are skipped: safe to repeat."""
    blocked = []
    for pod in pods:
        if pod.deleted:
            continue
        try:
            client.evict_pod(pod.namespace, pod.name, grace_period_s=_eviction_grace())
        except kube.TooManyRequests:
            blocked.append(f"{pod.namespace}/{pod.name}")
        except kube.NotFound:
            continue
    return blocked


def pods_left(pods: list[kube.Pod], how: str, blocked: list[str]) -> Wait:
    """The Wait of a drain that still has GPU pods on the node."""
    names = [f"{p.namespace}/{p.name}" for p in pods]
    message = f"{len(pods)} GPU pod(s) still running, {how}: {', '.join(names[:10])}"
    if blocked:
        message += f"; a PodDisruptionBudget blocks {', '.join(blocked[:10])}"
    return Wait(message, {"pods": names})


def _eviction_grace() -> int | None:
    value = getattr(settings, "MIG_EVICTION_GRACE_S", None)
    return None if value is None else int(value)


def step_apply(reconf: MigReconfiguration, now: datetime) -> Advance | Wait:
    if reconf.backend == Backend.AGENT:
        return _apply_agent(reconf, now)
    return _apply_operator(reconf)


def config_name_for(reconf: MigReconfiguration, current_label: str) -> str:
    """The mig.config value to set: the named config or layout asked for when it still means our
    target and differs from the label now; otherwise gpuaas-r<id> (-<attempt> after a resume), so
    the MIG manager always sees a changed label."""
    source = reconf.source
    if not reconf.attempts and source and source != current_label:
        if mig_configs.is_named_config(source):
            return source
        layout = reconf.layout
        if layout is not None and source == layout.config_name:
            indices = [int(k) for k in reconf.target]
            if {str(i): v for i, v in layout.targets_for(indices).items()} == reconf.target:
                return source
    suffix = f"-{reconf.attempts}" if reconf.attempts else ""
    return f"{GPUAAS_CONFIG_PREFIX}r{reconf.pk}{suffix}"


def mig_parted_sync_s() -> float:
    """How long kubelet may take to refresh the MIG manager's mounted copy of the mig-parted ConfigMap."""
    return float(getattr(settings, "MIG_PARTED_SYNC_S", 90))


def label_config(reconf: MigReconfiguration, client: kube.KubernetesClient, labels: dict[str, str]) -> Wait | None:
    """Point nvidia.com/mig.config at the reconfiguration's config once the MIG manager can read it.

    The manager reads a mounted copy of the ConfigMap that kubelet refreshes up to about a minute after
    a write, and validates the label's config against that copy at once: a label set right after the
    write names a config it may not see yet (state failed). So the config is written first (recorded in
    config_written_at), the label is set MIG_PARTED_SYNC_S later, and with it the state `pending` (the
    manager's `success` from the previous config must not read as ours). None once the label is ours.
    Re-entrant: the write is rebuilt from the database and the label patch is idempotent.
    """
    current = labels.get(mig_configs.MIG_CONFIG_LABEL, "")
    if not reconf.config_name:
        reconf.config_name = config_name_for(reconf, current)
        MigReconfiguration.objects.filter(pk=reconf.pk, config_name="").update(config_name=reconf.config_name)
        audit(reconf, reconf.step, Event.INFO, f"config {reconf.config_name} chosen (label was {current or 'unset'})")
    if current == reconf.config_name:
        return None
    if reconf.config_written_at is None:
        mig_configs.write_mig_parted_config(reconf.cluster, client)
        reconf.config_written_at = timezone.now()  # after the write: kubelet's delay counts from it
        MigReconfiguration.objects.filter(pk=reconf.pk).update(config_written_at=reconf.config_written_at)
    ready_at = reconf.config_written_at + timedelta(seconds=mig_parted_sync_s())
    if timezone.now() < ready_at:  # kubelet's clock, not the step's start
        return Wait(
            f"wrote {reconf.config_name} to ConfigMap {mig_configs.mig_parted_configmap()}; setting "
            f"{mig_configs.MIG_CONFIG_LABEL} at {ready_at:%H:%M:%S} UTC, once kubelet has refreshed the MIG "
            f"manager's mounted copy (MIG_PARTED_SYNC_S={mig_parted_sync_s():g})"
        )
    client.patch_node_labels(
        reconf.node.name, {mig_configs.MIG_CONFIG_LABEL: reconf.config_name, mig_configs.MIG_STATE_LABEL: "pending"}
    )
    return Wait(f"set {mig_configs.MIG_CONFIG_LABEL}={reconf.config_name}; MIG manager pending")


def mig_manager_outcome(reconf: MigReconfiguration, state: str) -> Wait | None:
    """None on `success`; Wait while `pending` or `rebooting` (the manager reboots the node to change a
    GPU's MIG mode and carries on after it); ReconfigurationError on `failed`."""
    if state == "success":
        return None
    if state == "failed":
        raise ReconfigurationError(
            f"the GPU Operator MIG manager failed to apply {reconf.config_name} ({mig_configs.MIG_STATE_LABEL}=failed)"
        )
    if state == "rebooting":
        return Wait(f"the MIG manager is rebooting {reconf.node.name} to change the MIG mode; waiting for it")
    return Wait(f"{mig_configs.MIG_STATE_LABEL}={state or 'unset'}")


def _apply_operator(reconf: MigReconfiguration) -> Advance | Wait:
    with mig_configs.client_for(reconf.cluster) as client:
        labels = client.get_node(reconf.node.name).labels
        waiting = label_config(reconf, client, labels)
    if waiting is not None:
        return waiting
    waiting = mig_manager_outcome(reconf, labels.get(mig_configs.MIG_STATE_LABEL, ""))
    if waiting is not None:
        return waiting
    commands.request_inventory(reconf)  # verify needs the node's NVML as it is now: ask its agent at once
    return Advance(f"MIG manager applied {reconf.config_name} ({mig_configs.MIG_STATE_LABEL}=success)")


def restart_device_plugin(client: kube.KubernetesClient, node_name: str) -> list[str]:
    """Delete the GPU Operator's device plugin pod(s) on the node; the DaemonSet starts a new one, which
    registers the node's devices as NVML shows them now. Returns the deleted pods' names."""
    deleted = []
    pods = client.list_pods_on_node(
        node_name, mig_configs.operator_namespace(), label_selector=f"app={DEVICE_PLUGIN_APP}"
    )
    for pod in pods:
        if pod.deleted:
            continue
        try:
            client.delete_pod(pod.namespace, pod.name)
        except kube.NotFound:
            continue
        deleted.append(pod.name)
    return deleted


def _apply_agent(reconf: MigReconfiguration, now: datetime) -> Advance | Wait:
    """Send the signed MIG command to the node's agent and wait for its result (operations.reconfiguration
    .commands); on the result, restart the device plugin so it registers the new instances."""
    result = commands.result_of(reconf)
    if result is None:
        sent = commands.send_if_due(reconf, now)
        return Wait(f"MIG command {commands.command_id(reconf)} {sent} to the node agent; waiting for its result")
    done = result["applied"]
    if result["error"]:
        raise ReconfigurationError(result["error"], {"applied": done})
    summary = "; ".join(
        f"GPU {i}: {len(r['destroyed'])} destroyed, {len(r['created'])} created, {len(r['kept'])} kept"
        for i, r in done.items()
    )
    with mig_configs.client_for(reconf.cluster) as client:
        restarted = restart_device_plugin(client, reconf.node.name)
    plugin = (
        f"device plugin pod {', '.join(restarted)} restarted"
        if restarted
        else "no device plugin pod found on the node to restart"
    )
    return Advance(f"NVML applied the plan ({summary}); {plugin}", {"applied": done, "device_plugin": restarted})


def advertised_mismatch(reconf: MigReconfiguration, node: kube.Node) -> dict[str, tuple[int, int]]:
    """{resource: (advertised, expected)} for the nvidia.com/mig-* resources the node's capacity gets
    wrong against the MIG instances rediscovery found (mixed strategy; other strategies are not checked).

    The device plugin registers its devices when its pod starts and never re-reads NVML, so after a
    direct NVML change the node keeps advertising the old instances until the restarted pod re-registers.
    """
    if node.labels.get("nvidia.com/mig.strategy") != "mixed":
        return {}
    product = get_product(reconf.plan["product"])
    expected: Counter[str] = Counter()
    for row, placements, _ in current_layouts(reconf.node).values():
        if row.mig_mode_current:
            expected.update(product.profile(p["profile"]).resource_name for p in placements)
    advertised = {r: int(v) for r, v in node.capacity.items() if r.startswith("nvidia.com/mig-")}
    return {
        r: (advertised.get(r, 0), expected.get(r, 0))
        for r in sorted(set(advertised) | set(expected))
        if advertised.get(r, 0) != expected.get(r, 0)
    }


def _settle_agent(reconf: MigReconfiguration) -> Wait | None:
    """After an NVML change: wait until the node advertises the new instances, then keep
    nvidia.com/mig.config in step on nodes the MIG manager runs on, so the layout survives a reboot
    (the manager re-applies the label's config at start) instead of being reverted. The manager asserts
    the config is already applied and answers `success` without touching the GPUs."""
    with mig_configs.client_for(reconf.cluster) as client:
        node = client.get_node(reconf.node.name)
        wrong = advertised_mismatch(reconf, node)
        if wrong:
            what = ", ".join(f"{r}: {have} (expected {want})" for r, (have, want) in wrong.items())
            return Wait(f"the device plugin still advertises the old instances ({what}); waiting for it to re-register")
        if node.labels.get(MIG_MANAGER_DEPLOY_LABEL) != "true":
            return None
        waiting = label_config(reconf, client, node.labels)
    if waiting is not None:
        return waiting
    return mig_manager_outcome(reconf, node.labels.get(mig_configs.MIG_STATE_LABEL, ""))


def step_verify(reconf: MigReconfiguration, now: datetime) -> Advance | Wait:
    agent = reconf.backend == Backend.AGENT  # else the GPU Operator's MIG manager applied the plan
    if not agent:
        with mig_configs.client_for(reconf.cluster) as client:
            labels = client.get_node(reconf.node.name).labels
        config, state = labels.get(mig_configs.MIG_CONFIG_LABEL), labels.get(mig_configs.MIG_STATE_LABEL)
        if config != reconf.config_name:
            raise ReconfigurationError(
                f"{mig_configs.MIG_CONFIG_LABEL} is {config!r}, not {reconf.config_name!r}: someone changed it"
            )
        if state == "failed":
            raise ReconfigurationError(f"{mig_configs.MIG_STATE_LABEL}=failed for {config}")
        if state != "success":
            return Wait(f"{mig_configs.MIG_STATE_LABEL}={state or 'unset'}")
        waiting = _await_inventory(reconf, now)  # (the agent backend's result carried its read-back inventory)
        if waiting is not None:
            return waiting
    layouts = current_layouts(reconf.node)
    mismatches, observed = [], {}
    for key, gpu in reconf.plan["gpus"].items():
        index = int(key)
        if index not in layouts:
            raise ReconfigurationError(f"GPU {index} is no longer present on {reconf.node}")
        row, placements, _ = layouts[index]
        observed[key] = placements
        if row.mig_mode_current != gpu["mig"]:
            mismatches.append(
                f"GPU {index}: MIG {'on' if row.mig_mode_current else 'off'}, planned {_describe(gpu['mig'], [])}"
            )
            continue
        if agent:
            if placement_set(placements) != placement_set(gpu["placements"]):
                mismatches.append(
                    f"GPU {index}: {_describe(True, placements)}, planned {_describe(True, gpu['placements'])}"
                )
        elif profile_counts(placements) != profile_counts(gpu["placements"]):
            mismatches.append(
                f"GPU {index}: {_describe(True, placements)}, planned {_describe(True, gpu['placements'])}"
            )
    if mismatches:
        commands.request_inventory(reconf)  # ask the agent for a fresh read (it comes back on the ingest queue)
        return Wait("rediscovery does not show the plan yet: " + "; ".join(mismatches), {"observed": observed})
    if agent:
        waiting = _settle_agent(reconf)
        if waiting is not None:
            return waiting
    updates = {}
    moved = [k for k, g in reconf.plan["gpus"].items() if placement_set(observed[k]) != placement_set(g["placements"])]
    if moved:  # operator path: mig-parted chose other starts for the same profiles
        plan = dict(reconf.plan)
        plan["gpus"] = {k: {**g, "placements": observed[k]} if k in moved else g for k, g in plan["gpus"].items()}
        updates["plan"] = plan
    message = "rediscovery shows the planned instances"
    if moved:
        message += f" (mig-parted placed GPU {', '.join(moved)} differently; recorded)"
    notes = reattach_allocations(reconf)
    return Advance(message, {"observed": observed, "allocations": notes}, updates)


def _await_inventory(reconf: MigReconfiguration, now: datetime) -> Wait | None:
    """Operator path: None once the node's rows show an NVML read its agent made after the MIG manager
    said `success` (apply advanced then, and asked for one); until then Wait, asking again each pass.

    The read comes from the node agent through the ingest queue (read_node_inventory_task): this step
    runs on the control plane, and nothing of it runs on the node. Reads are dated by the node's clock
    to the second, and one in apply's own second counts: the MIG manager changes the GPUs seconds before
    it sets `success` (it restarts the GPU clients in between). A node clock behind the control plane's
    only delays verify (each pass asks again) while the skew stays well under MIG_VERIFY_TIMEOUT_S.
    """
    node, since = reconf.node, reconf.applied_at or now
    if node.inventory_read_since(since):
        return None
    commands.request_inventory(reconf)
    message = f"waiting for the node agent's NVML inventory of {reconf.node.name} read since {since:%H:%M:%S} UTC"
    if node.inventory_error:
        message += f" (its latest read failed: {node.inventory_error})"
    return Wait(message)


def reattach_allocations(reconf: MigReconfiguration) -> list[str]:
    """Active MIG allocations on this node whose instance is gone move to a new instance of the same profile on
    the same GPU, or end (pools.services.rehome_allocations, which owns the table). Rediscovery already did
    this in its own transaction (the inventory's capacity.signals.instances_gone); this catches any left over and
    writes what happened to the reconfiguration's trail."""
    gone = (
        Allocation.objects.active()
        .filter(gpu__node_id=reconf.node_id, mig_instance__isnull=False)
        .exclude(mig_instance__state="active")
        .values_list("mig_instance_id", flat=True)
    )
    notes = rehome_allocations(list(gone), at=timezone.now(), cause=AllocationEndCause.MIG_CHANGE)
    for note in notes:
        audit(reconf, Step.VERIFY, Event.INFO, note)
    return notes


def step_uncordon(reconf: MigReconfiguration, now: datetime) -> Advance:
    return uncordon_node(reconf)


def uncordon_node(row) -> Advance:
    """Uncordon the row's node, only if gpuaas cordoned it (cordon_node recorded was_cordoned=False)."""
    row.refresh_from_db(fields=["was_cordoned"])
    if row.was_cordoned is not False:
        why = "it was cordoned before gpuaas started" if row.was_cordoned else "gpuaas never cordoned it"
        return Advance(f"node left as it was ({why})")
    with mig_configs.client_for(row.cluster) as client:
        client.uncordon(row.node.name)
    return Advance("node uncordoned")


STEPS: dict[str, Callable[[MigReconfiguration, datetime], Advance | Wait]] = {
    Step.PLAN: step_plan,
    Step.CHECK: step_check,
    Step.CORDON: step_cordon,
    Step.DRAIN: step_drain,
    Step.APPLY: step_apply,
    Step.VERIFY: step_verify,
    Step.UNCORDON: step_uncordon,
}
