"""Choosing a vm-vgpu node's vGPU type, the way MIG reconfiguration chooses a MIG layout.

NVIDIA's vGPU device manager (NVIDIA/vgpu-device-manager, cmd/nvidia-k8s-vgpu-dm/main.go) watches the node
label `nvidia.com/vgpu.config`, applies the config of that name from its ConfigMap's `config.yaml` (the GPU
Operator's ClusterPolicy `vgpuDeviceManager.config.name`; the operator ships `default-vgpu-devices-config`,
NVIDIA/gpu-operator controllers/object_controls.go), and reports `nvidia.com/vgpu.config.state`: `pending`
while it pauses the sandbox device plugin and recreates the vGPUs, then `success` or `failed`. gpuaas writes
its own ConfigMap (VGPU_DEVICES_CONFIGMAP, one config per catalog type: capacity.vgpu.device_manager_document),
makes sure the KubeVirt CR permits the type's mediated device (KubeVirt runs no VMI asking for a device its
spec.configuration.permittedHostDevices does not list: capacity.adapters.kubernetes.kubevirt) and sets the label;
discovery then reads the state label and the types the kubevirt-gpu-device-plugin
advertises (`nvidia.com/NVIDIA_<type>`, SpecAndCount rows of kind vgpu).

A GPU's vGPUs are all of one type (equal-size mode) and a vGPU a VM holds cannot be destroyed, so a type
change is refused while any vGPU of the node is in use by a VM (a running workload on a vGPU resource) or
held by a pool (an active allocation): the VMs would lose their devices, the pools their type.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from capacity.adapters import kubernetes as kube
from capacity.choices import SpecKind
from capacity.mig.catalog import find_product
from capacity.models import Allocation, Cluster, GpuCapacity, NodeCapacity, WorkloadProfile
from capacity.vgpu import (
    DEVICE_MANAGER_KEY,
    RESOURCE_PREFIX,
    VGPU_CONFIG_LABEL,
    VGPU_TYPES,
    device_manager_document,
    is_vgpu_node,
    types_for_product,
)

from . import mig_configs


class VgpuConfigError(ValueError):
    """A vGPU type change gpuaas refuses; `field` names the input to fix."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class ClusterRefused(RuntimeError):
    """The cluster's API did not take the change (unreachable, forbidden, conflict): nothing recorded here."""


@dataclass(frozen=True)
class VgpuConfigChange:
    node: str
    vgpu_type: str
    changed: bool  # False: the label already named this type


def device_manager_configmap() -> str:
    return getattr(settings, "VGPU_DEVICES_CONFIGMAP", "gpuaas-vgpu-devices-config")


def node_product(node: NodeCapacity) -> str | None:
    """The catalog key of the node's GPUs: the GPUs' own (NVML), else the GFD product label."""
    key = GpuCapacity.objects.present().filter(node=node).most_common_product()
    if key:
        return key
    product = find_product(node.gpu_product) if node.gpu_product else None
    return product.key if product else None


def vgpus_in_use(node: NodeCapacity) -> list[str]:
    """Why the node's vGPUs cannot be recreated now: running VMs on a vGPU resource, pools holding vGPUs."""
    reasons = [
        f"{'VM' if vmi else 'pod'} {namespace}/{vmi or pod} ({resource.removeprefix(RESOURCE_PREFIX)})"
        for namespace, pod, vmi, resource in WorkloadProfile.objects.running()
        .filter(node=node, resource_name__startswith=RESOURCE_PREFIX)
        .order_by("namespace", "pod_name")
        .values_list("namespace", "pod_name", "vmi_name", "resource_name")
    ]
    held = (
        Allocation.objects.active()
        .filter(gpu__node=node, kind=SpecKind.VGPU)
        .values_list("pool_id", flat=True)
        .distinct()
    )
    reasons += [f"pool {pk}" for pk in sorted(held)]
    return reasons


def write_device_manager_config(client: kube.KubernetesClient) -> dict:
    """Create or replace gpuaas's vGPU device manager ConfigMap (idempotent; other keys are kept)."""
    document = device_manager_document()
    mig_configs.merge_config_map_keys(
        client,
        mig_configs.operator_namespace(),
        device_manager_configmap(),
        {DEVICE_MANAGER_KEY: mig_configs.dump_yaml(document)},
        DEVICE_MANAGER_KEY,
    )
    return document


def set_vgpu_config(node: NodeCapacity, vgpu_type: str, *, client: kube.KubernetesClient | None = None):
    """Give every GPU of a vm-vgpu node vGPUs of `vgpu_type`: write the device manager's ConfigMap, permit the
    type's mediated device in the KubeVirt CR, then set the node's nvidia.com/vgpu.config label. Returns a
    VgpuConfigChange; raises VgpuConfigError (nothing written) for a node not in vm-vgpu mode, a type its GPU
    does not offer, or vGPUs in use.

    Locking: the cluster row (FOR NO KEY UPDATE, the capacity services' contract) then the node row FOR UPDATE,
    for the whole call, so two changes of one node are serialised against each other and against discovery. Idempotent:
    the same type again writes nothing. A Kubernetes error becomes ClusterRefused and changes nothing here (the
    ConfigMap may have been written: it is idempotent and names every type, so a retry is safe).
    """
    with transaction.atomic():
        Cluster.objects.select_for_update(no_key=True).filter(pk=node.cluster_id).values_list("pk").get()
        node = NodeCapacity.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=node.pk)
        if node.gone_at is not None:
            raise VgpuConfigError("node", f"node {node.name} is gone")
        if not is_vgpu_node(node.labels or {}):
            raise VgpuConfigError(
                "node",
                f"node {node.name} is not in vm-vgpu mode: label it nvidia.com/gpu.workload.config=vm-vgpu first",
            )
        product = node_product(node)
        offered = [t.name for t in types_for_product(product)] if product else []
        if vgpu_type not in VGPU_TYPES or vgpu_type not in offered:
            raise VgpuConfigError(
                "vgpu_type",
                f"{node.name}'s GPUs ({product or 'unknown product'}) offer "
                + (", ".join(offered) if offered else "no catalog vGPU type")
                + f", not {vgpu_type!r}",
            )
        current = (node.labels or {}).get(VGPU_CONFIG_LABEL, "")
        if current == vgpu_type:
            return VgpuConfigChange(node.name, vgpu_type, changed=False)
        busy = vgpus_in_use(node)
        if busy:
            raise VgpuConfigError(
                "vgpu_type",
                f"{node.name}'s vGPUs ({current or 'none'}) are in use by "
                + ", ".join(busy)
                + ": stop those VMs and release those pools before changing the type",
            )

        def run(k: kube.KubernetesClient) -> None:
            write_device_manager_config(k)
            k.permit_mediated_devices([VGPU_TYPES[vgpu_type].permitted_device])  # before the vGPUs appear
            k.patch_node_labels(node.name, {VGPU_CONFIG_LABEL: vgpu_type})

        try:
            if client is None:
                with mig_configs.client_for(node.cluster) as own:
                    run(own)
            else:
                run(client)
        except kube.KubernetesError as exc:
            raise ClusterRefused(
                f"cluster {node.cluster.name} refused the change: {type(exc).__name__}: {exc}"
            ) from exc
        labels = dict(node.labels or {}, **{VGPU_CONFIG_LABEL: vgpu_type})
        NodeCapacity.objects.filter(pk=node.pk).update(labels=labels)
    return VgpuConfigChange(node.name, vgpu_type, changed=True)
