"""gpuaas's borrowed-units ValidatingAdmissionPolicy (deploy/admission-policy-borrowed.yaml) as kube-apiserver
applies it.

Knob: `ClusterSettings.admission_policy` (as for simcluster.admission). In a namespace gpuaas labels
`gpuaas.io/borrowing=only` (pools.provisioning: the project holds lent units on the cluster and none of its
own), a CREATE of a pod that requests an nvidia.com/* extended resource or a ResourceClaim is refused
unless its spec.priorityClassName is `gpuaas-borrowed`: such pods can only be borrowed ones, and the
borrowed class is what the lender's reclaim and the scheduler's preemption recognise. The rule is written here
once more in Python; tests/deploy checks it against the manifest.
"""

from __future__ import annotations

POLICY = "gpuaas-borrowed-pods"
BINDING = "gpuaas-borrowed-pods"
NAMESPACE_LABEL = ("gpuaas.io/borrowing", "only")
PRIORITY_CLASS = "gpuaas-borrowed"
MESSAGE = (
    "this project runs on borrowed GPU units only: pods that request GPUs must set priorityClassName: gpuaas-borrowed"
)


def _wants_gpu(spec: dict) -> bool:
    if spec.get("resourceClaims"):
        return True
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            resources = (container or {}).get("resources") or {}
            for section in ("limits", "requests"):
                if any(str(k).startswith("nvidia.com/") for k in (resources.get(section) or {})):
                    return True
    return False


def admit(cluster, plural: str, namespace: str | None, obj: dict) -> None:
    """Raise the policy's refusal if it matches a pod CREATE and denies it; return otherwise."""
    from .kube import ApiError

    if plural != "pods" or not cluster.settings.admission_policy:
        return
    ns = cluster.namespaces.get(namespace or "")
    labels = ((ns.obj.get("metadata") or {}).get("labels") or {}) if ns is not None else {}
    if labels.get(NAMESPACE_LABEL[0]) != NAMESPACE_LABEL[1]:
        return
    spec = obj.get("spec") or {}
    if not _wants_gpu(spec) or spec.get("priorityClassName") == PRIORITY_CLASS:
        return
    name = (obj.get("metadata") or {}).get("name") or ""
    message = (
        f"pods \"{name}\" is forbidden: ValidatingAdmissionPolicy '{POLICY}' with binding "
        f"'{BINDING}' denied request: {MESSAGE}"
    )
    raise ApiError(403, "Forbidden", message, {"name": name, "kind": "pods"})
