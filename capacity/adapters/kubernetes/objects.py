"""The parts of Kubernetes objects gpuaas reads, parsed from the API's JSON into small dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field

NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"


@dataclass(slots=True)
class Node:
    """The parts of a v1 Node that gpuaas reads."""

    name: str
    uid: str
    resource_version: str
    labels: dict[str, str]
    annotations: dict[str, str]
    capacity: dict[str, str]
    allocatable: dict[str, str]
    unschedulable: bool
    ready: bool
    taints: list[dict] = field(default_factory=list)


@dataclass(slots=True)
class Pod:
    """The parts of a v1 Pod that gpuaas reads. `requests` holds extended resources only, as ints."""

    namespace: str
    name: str
    uid: str
    node_name: str
    phase: str
    labels: dict[str, str]
    annotations: dict[str, str]
    requests: dict[str, int]
    start_time: str | None
    deleted: bool

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def parse_node(obj: dict) -> Node:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = False
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            break
    return Node(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        capacity=status.get("capacity") or {},
        allocatable=status.get("allocatable") or {},
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        taints=spec.get("taints") or [],
    )


def _extended(resources: dict | None) -> dict[str, int]:
    """Extended resources (names with a '/') as integers; cpu/memory quantities are skipped."""
    out: dict[str, int] = {}
    for name, value in (resources or {}).items():
        if "/" in name:
            try:
                out[name] = int(value)
            except (TypeError, ValueError):
                continue
    return out


def pod_extended_requests(spec: dict) -> dict[str, int]:
    """Effective extended-resource request of a pod: max(sum over containers, any init container).

    A limit stands in for a missing request, as the API server defaults requests to limits.
    """

    def wanted(container: dict) -> dict[str, int]:
        res = container.get("resources") or {}
        return _extended({**(res.get("limits") or {}), **(res.get("requests") or {})})

    total: dict[str, int] = {}
    for container in spec.get("containers") or ():
        for name, count in wanted(container).items():
            total[name] = total.get(name, 0) + count
    for container in spec.get("initContainers") or ():
        for name, count in wanted(container).items():
            total[name] = max(total.get(name, 0), count)
    return total


def parse_pod(obj: dict) -> Pod:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return Pod(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        node_name=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        requests=pod_extended_requests(spec),
        start_time=status.get("startTime"),
        deleted=bool(meta.get("deletionTimestamp")),
    )
