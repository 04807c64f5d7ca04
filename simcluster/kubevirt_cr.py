"""The KubeVirt CR (kubevirt.io/v1 `KubeVirt`, `kubevirt/kubevirt`) and the host devices it permits.

KubeVirt lets a VMI use a mediated device only when the cluster's KubeVirt CR lists its resource name under
`spec.configuration.permittedHostDevices.mediatedDevices[]` (`mdevNameSelector`, `resourceName`, and
`externalResourceProvider: true` when another device plugin, here NVIDIA's kubevirt-gpu-device-plugin /
the GPU Operator's sandbox device plugin, advertises them): kubevirt/kubevirt docs/host-devices.md
("Permitting Host Devices to be used in the cluster") and the KubeVirt user guide's "Host Devices Assignment";
NVIDIA/kubevirt-gpu-device-plugin's README shows the entries for its vGPU resources. PCI devices are listed
under `pciHostDevices[]` the same way.

Modelled here: each cluster starts with one CR that permits nothing (KubeVirt's default); virt-controller
creates no launcher pod for a VMI asking for a GPU or host device no CR permits, and the VMI stays Scheduling
with a `PodScheduled=False` condition naming the device; once a CR permits it, the next resync (every kubelet
pass) creates the pod. Not modelled: feature gates, mdevNameSelector matching against the node's mdev types,
virt-handler's own device plugins for devices without `externalResourceProvider`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .state import Cluster

if TYPE_CHECKING:
    from .kube import ClusterApi

PLURAL = "kubevirts"
KIND = "KubeVirt"
NAMESPACE = "kubevirt"
NAME = "kubevirt"
DISCOVERY = {"name": PLURAL, "singularName": "kubevirt", "namespaced": True, "kind": KIND, "shortNames": ["kv", "kvs"]}


def default_cr() -> dict:
    """The CR the KubeVirt operator's install creates: no host devices permitted."""
    return {"metadata": {"name": NAME}, "spec": {"configuration": {"developerConfiguration": {"featureGates": []}}}}


def install(api: ClusterApi) -> None:
    """The KubeVirt operator's install in a new cluster: its namespace and the default CR."""
    api.create("namespaces", None, {"metadata": {"name": NAMESPACE}})
    api.create(PLURAL, NAMESPACE, default_cr())


def permitted(cluster: Cluster) -> set[str]:
    """The resource names every KubeVirt CR of the cluster permits (mediated and PCI host devices)."""
    names: set[str] = set()
    for record in cluster.kubevirts.values():
        config = ((record.obj.get("spec") or {}).get("configuration") or {}).get("permittedHostDevices") or {}
        for section in ("mediatedDevices", "pciHostDevices"):
            for entry in config.get(section) or ():
                if isinstance(entry, dict) and entry.get("resourceName"):
                    names.add(str(entry["resourceName"]))
    return names


def not_permitted(cluster: Cluster, devices: list[str]) -> str:
    """Why a VMI asking for `devices` cannot start ("" when every one is permitted)."""
    allowed = permitted(cluster)
    missing = sorted({d for d in devices if d not in allowed})
    if not missing:
        return ""
    return (
        f"{', '.join(missing)} not permitted in the KubeVirt CR's spec.configuration.permittedHostDevices"
        " (mediatedDevices / pciHostDevices)"
    )
