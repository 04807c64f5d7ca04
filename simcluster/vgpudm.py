"""NVIDIA's vGPU device manager on vm-vgpu nodes (NVIDIA/vgpu-device-manager, cmd/nvidia-k8s-vgpu-dm/main.go).

On a changed `nvidia.com/vgpu.config` label it reads the named config from its ConfigMap's `config.yaml`
(gpuaas's `gpuaas-vgpu-devices-config` when present, standing for "the ClusterPolicy's
vgpuDeviceManager.config.name points at it", else the operator's `default-vgpu-devices-config`): a name that
is not there, or a type the node's GPUs do not offer -> `nvidia.com/vgpu.config.state=failed` at once; the type
already applied -> `success` at once; otherwise `pending` while the sandbox device plugin is paused, and after
`SimState.mig_manager_delay` seconds (reconfiguration takes time; or at once through `run_mig_manager()`) the
vGPUs are recreated -> `success`, or `failed` if a pod (a VM's virt-launcher) still holds one of the node's
vGPUs: a vGPU in use cannot be destroyed, so a type change needs the GPU's existing vGPUs gone.
Until a change was asked for through the API, the scenario's label is what is applied (`Node.vgpu_type` None).
"""

from __future__ import annotations

import time

import yaml

from capacity.vgpu import (
    DEVICE_MANAGER_KEY,
    VGPU_CONFIG_LABEL,
    VGPU_CONFIG_STATE_LABEL,
    VGPU_TYPES,
    VM_VGPU,
    WORKLOAD_CONFIG_LABEL,
)

from .state import Cluster, MigJob, Node

GPUAAS_CONFIGMAP = "gpuaas-vgpu-devices-config"
DEFAULT_CONFIGMAP = "default-vgpu-devices-config"
VGPU_DEVICE_MARK = "::vgpu-"


def applied_type(node: Node) -> str:
    """The vGPU type the node's GPUs are carved into now."""
    return node.vgpu_type if node.vgpu_type is not None else (node.labels or {}).get(VGPU_CONFIG_LABEL, "")


def _configs(cluster: Cluster) -> dict | None:
    for name in (GPUAAS_CONFIGMAP, DEFAULT_CONFIGMAP):
        record = cluster.configmaps.get((cluster.settings.operator_namespace, name))
        if record is None:
            continue
        try:
            document = yaml.safe_load((record.obj.get("data") or {}).get(DEVICE_MANAGER_KEY) or "")
        except yaml.YAMLError:
            return None
        configs = document.get("vgpu-configs") if isinstance(document, dict) else None
        return configs if isinstance(configs, dict) else None
    return None


def resolve(cluster: Cluster, node: Node, config: str) -> tuple[str | None, str]:
    """(the one vGPU type the config creates on this node's GPUs, "") or (None, why it cannot be applied)."""
    configs = _configs(cluster)
    if configs is None:
        return None, "no vGPU device manager config.yaml in the operator namespace"
    entries = configs.get(config)
    if not isinstance(entries, list) or not entries:
        return None, f"config {config!r} is not in the vGPU device manager's config.yaml"
    names = {name for entry in entries if isinstance(entry, dict) for name in (entry.get("vgpu-devices") or {})}
    products = {gpu.product.key for gpu in node.gpus}
    wrong = sorted(n for n in names if n not in VGPU_TYPES or VGPU_TYPES[n].product not in products)
    if len(names) != 1 or wrong:
        return None, f"config {config!r} asks for {', '.join(sorted(names)) or 'no vGPUs'}: not one type of this GPU"
    return names.pop(), ""


def vgpus_held(node: Node) -> list[str]:
    """The pods holding one of the node's vGPUs ("namespace/name")."""
    return sorted({"/".join(pod) for device, pod in node.assigned.items() if VGPU_DEVICE_MARK in device})


def _finish(cluster: Cluster, node: Node, ok: bool, message: str) -> None:
    node.vgpu_message = message
    node.labels[VGPU_CONFIG_STATE_LABEL] = "success" if ok else "failed"
    cluster.touch(node)


def on_label_changed(cluster: Cluster, node: Node, old: dict[str, str]) -> None:
    """The device manager saw nvidia.com/vgpu.config change: validate, then pending and a job (or finish now)."""
    wanted = node.labels.get(VGPU_CONFIG_LABEL, "")
    if node.labels.get(WORKLOAD_CONFIG_LABEL) != VM_VGPU or wanted == old.get(VGPU_CONFIG_LABEL, ""):
        return
    if node.vgpu_type is None:
        node.vgpu_type = old.get(VGPU_CONFIG_LABEL, "")
    node.vgpu_job = None
    vgpu_type, why = resolve(cluster, node, wanted) if wanted else (None, "no config named")
    if vgpu_type is None:
        _finish(cluster, node, False, why)
        return
    if vgpu_type == node.vgpu_type:
        _finish(cluster, node, True, f"{wanted!r} is already applied")
        return
    node.labels[VGPU_CONFIG_STATE_LABEL] = "pending"
    node.vgpu_job = MigJob(config=wanted, due=time.monotonic() + cluster.state.mig_manager_delay)
    cluster.touch(node)


def run_due(cluster: Cluster, now: float, *, force: bool) -> list[Node]:
    """Apply the due vGPU jobs; returns the nodes whose vGPUs were recreated (their devices need refreshing)."""
    changed = []
    for node in list(cluster.nodes.values()):
        job = node.vgpu_job
        if job is None or not (force or job.due <= now):
            continue
        node.vgpu_job = None
        vgpu_type, why = resolve(cluster, node, job.config)
        if vgpu_type is None:
            _finish(cluster, node, False, why)
            continue
        held = vgpus_held(node)
        if held:
            _finish(cluster, node, False, f"vGPUs of {node.vgpu_type!r} are in use by {', '.join(held)}")
            continue
        node.vgpu_type = vgpu_type
        _finish(cluster, node, True, f"applied {job.config!r}")
        changed.append(node)
    return changed
