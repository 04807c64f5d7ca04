"""KubeVirt's VirtualMachineInstance API (kubevirt.io/v1) and what virt-controller does with one.

A VMI asks for GPUs and vGPUs in `spec.domain.devices.gpus[]` (`name`, `deviceName`: the extended resource a
device plugin advertises, `nvidia.com/NVIDIA_H100XM-20C` from NVIDIA/kubevirt-gpu-device-plugin, whose resource
name is the mdev type's name with spaces as underscores: pkg/device_plugin/device_plugin.go). KubeVirt's webhook
checks each GPU's deviceName; here a name outside `nvidia.com/` is refused at once (422), and one no KubeVirt CR
permits (`spec.configuration.permittedHostDevices`, simcluster.kubevirt_cr) gets no launcher pod: the VMI stays
Scheduling with the reason until a CR permits it (the resync in `sync`).

virt-controller runs each VMI in a virt-launcher pod that requests those resources (so ResourceQuota and the
scheduler see the VM as that pod), labelled `kubevirt.io=virt-launcher` and `kubevirt.io/created-by=<VMI uid>`
and annotated `kubevirt.io/domain=<VMI name>` (kubevirt/kubevirt staging/src/kubevirt.io/api/core/v1/types.go).
The VMI's status follows its pod, computed on read: Pending (no pod yet, or the pod was refused, with a
`Synchronized=False FailedCreate` condition), Scheduling (pod pending; an unschedulable pod's
`PodScheduled=False Unschedulable` condition is copied, as virt-controller does), Scheduled (bound, starting),
Running (with `nodeName`), Succeeded / Failed. Deleting the VMI deletes its pod (which frees the vGPU).
Not modelled: VirtualMachine (the VMI's owner), live migration, the guest.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from . import kubevirt_cr
from .state import Cluster, Record

if TYPE_CHECKING:
    from .kube import ClusterApi

GROUP = "kubevirt.io"
API_VERSION = "kubevirt.io/v1"
PLURAL = "virtualmachineinstances"
APP_LABEL = "kubevirt.io"
CREATED_BY_LABEL = "kubevirt.io/created-by"
DOMAIN_ANNOTATION = "kubevirt.io/domain"
NODE_NAME_LABEL = "kubevirt.io/nodeName"
CONTROLLER_USER = "system:serviceaccount:kubevirt:kubevirt-controller"
LAUNCHER_IMAGE = "quay.io/kubevirt/virt-launcher:v1.5.0"
PERMITTED_PREFIX = "nvidia.com/"


def gpus(vmi: dict) -> list[dict]:
    return ((((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}).get("gpus")) or []


def validate(vmi: dict) -> list[tuple[str, str]]:
    """The webhook's checks on the parts modelled here: spec.domain present, each GPU named and permitted."""
    spec = vmi.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("domain"), dict):
        return [("spec.domain", "Required value")]
    problems = []
    devices = gpus(vmi)
    if not isinstance(devices, list):
        return [("spec.domain.devices.gpus", "Invalid value: must be a list")]
    for i, gpu in enumerate(devices):
        if not isinstance(gpu, dict) or not gpu.get("name"):
            problems.append((f"spec.domain.devices.gpus[{i}].name", "Required value"))
        elif not str(gpu.get("deviceName") or "").startswith(PERMITTED_PREFIX):
            problems.append(
                (
                    f"spec.domain.devices.gpus[{i}].deviceName",
                    f"Invalid value: GPU {gpu.get('deviceName')} is not permitted in permittedHostDevices "
                    "configuration",
                )
            )
    return problems


def launcher_pod(vmi: dict) -> dict:
    """The virt-launcher pod virt-controller creates for a VMI: one `compute` container requesting its devices."""
    meta, spec = vmi["metadata"], vmi.get("spec") or {}
    resources: dict[str, int] = {}
    for gpu in gpus(vmi):
        resources[gpu["deviceName"]] = resources.get(gpu["deviceName"], 0) + 1
    amounts = {name: str(n) for name, n in resources.items()}
    pod_spec: dict = {
        "containers": [
            {"name": "compute", "image": LAUNCHER_IMAGE, "resources": {"requests": amounts, "limits": dict(amounts)}}
        ],
        "restartPolicy": "Never",
    }
    for key in ("nodeSelector", "affinity", "tolerations", "priorityClassName"):
        if spec.get(key):
            pod_spec[key] = copy.deepcopy(spec[key])
    return {
        "metadata": {
            "generateName": f"virt-launcher-{meta['name']}-",
            "labels": {**(meta.get("labels") or {}), APP_LABEL: "virt-launcher", CREATED_BY_LABEL: meta["uid"]},
            "annotations": {DOMAIN_ANNOTATION: meta["name"]},
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "VirtualMachineInstance", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "spec": pod_spec,
    }


def launcher_of(cluster: Cluster, vmi: dict) -> Record | None:
    namespace, uid = vmi["metadata"]["namespace"], vmi["metadata"]["uid"]
    for (ns, _), record in cluster.pods.items():
        if ns == namespace and (record.obj["metadata"].get("labels") or {}).get(CREATED_BY_LABEL) == uid:
            return record
    return None


def on_created(api: ClusterApi, record: Record) -> None:
    """virt-controller: create the VMI's launcher pod as its own ServiceAccount (quota and admission apply)."""
    from .kube import ApiError, ClusterApi  # cycle: kube stores VMIs through this module

    vmi = record.obj
    why = kubevirt_cr.not_permitted(api.cluster, [gpu.get("deviceName", "") for gpu in gpus(vmi)])
    if why:
        api.cluster.vmi_waiting[vmi["metadata"]["uid"]] = why
        return
    api.cluster.vmi_waiting.pop(vmi["metadata"]["uid"], None)
    controller = ClusterApi(api.cluster, user=CONTROLLER_USER)
    try:
        controller.create("pods", vmi["metadata"]["namespace"], launcher_pod(vmi))
    except ApiError as err:
        api.cluster.vmi_errors[vmi["metadata"]["uid"]] = err.message


def on_deleted(api: ClusterApi, vmi: dict) -> None:
    """The VMI is gone: its launcher pod is deleted (its devices return to the node when it has stopped)."""
    from .kube import ClusterApi  # cycle: kube stores VMIs through this module

    api.cluster.vmi_errors.pop(vmi["metadata"]["uid"], None)
    api.cluster.vmi_waiting.pop(vmi["metadata"]["uid"], None)
    pod = launcher_of(api.cluster, vmi)
    if pod is not None:
        meta = pod.obj["metadata"]
        ClusterApi(api.cluster, user=CONTROLLER_USER).delete("pods", meta["namespace"], meta["name"], 0)


def _condition(type_: str, reason: str, message: str, when: str) -> dict:
    return {
        "type": type_,
        "status": "False",
        "reason": reason,
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": when,
    }


def render(cluster: Cluster, vmi: dict) -> dict:
    """The VMI with the status virt-controller and virt-handler would report now."""
    out = copy.deepcopy(vmi)
    uid = vmi["metadata"]["uid"]
    pod = launcher_of(cluster, vmi)
    when = vmi["metadata"].get("creationTimestamp")
    status: dict = {"phase": "Pending", "conditions": [], "guestOSInfo": {}}
    if pod is None and uid in cluster.vmi_waiting:
        status["phase"] = "Scheduling"
        status["conditions"] = [_condition("PodScheduled", "Unschedulable", cluster.vmi_waiting[uid], when)]
        out["status"] = status
        return out
    if pod is None:
        error = cluster.vmi_errors.get(uid)
        if error:
            status["conditions"] = [_condition("Synchronized", "FailedCreate", error, when)]
        out["status"] = status
        return out
    pod_status = pod.obj.get("status") or {}
    phase = pod_status.get("phase", "Pending")
    node_name = pod.obj["spec"].get("nodeName") or ""
    status["activePods"] = {pod.obj["metadata"]["uid"]: node_name}
    if phase == "Pending" and not node_name:
        status["phase"] = "Scheduling"
        status["conditions"] = [
            copy.deepcopy(c)
            for c in pod_status.get("conditions") or ()
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ]
    elif phase == "Pending":
        status["phase"] = "Scheduled"
    else:
        status["phase"] = phase  # Running, Succeeded, Failed
        status["conditions"] = [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]
    if node_name:
        status["nodeName"] = node_name
        out["metadata"].setdefault("labels", {})[NODE_NAME_LABEL] = node_name
    out["status"] = status
    return out


def sync(cluster: Cluster) -> None:
    """virt-controller's resync: VMIs waiting for a host device the KubeVirt CR did not permit get their launcher
    pod once it does."""
    from .kube import ClusterApi  # cycle: kube stores VMIs through this module

    for record in list(cluster.virtualmachineinstances.values()):
        if record.obj["metadata"]["uid"] in cluster.vmi_waiting:
            on_created(ClusterApi(cluster), record)
