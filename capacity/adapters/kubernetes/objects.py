"""The parts of Kubernetes objects gpuaas reads, parsed from the API's JSON into small dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field

NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"
# KubeVirt runs each VirtualMachineInstance in a virt-launcher pod, which requests the VM's devices
# (spec.domain.devices.gpus[].deviceName) as extended resources; the pod carries the label
# kubevirt.io=virt-launcher and names its VMI in the annotation kubevirt.io/domain (kubevirt/kubevirt
# staging/src/kubevirt.io/api/core/v1/types.go: AppLabel, DomainAnnotation, CreatedByLabel = the VMI's uid).
KUBEVIRT_APP_LABEL = "kubevirt.io"
VIRT_LAUNCHER = "virt-launcher"
VMI_DOMAIN_ANNOTATION = "kubevirt.io/domain"
VMI_CREATED_BY_LABEL = "kubevirt.io/created-by"


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
    claims: list[str] = field(default_factory=list)  # names of its ResourceClaims (DRA), in its namespace
    priority_class: str = ""  # spec.priorityClassName

    @property
    def pending(self) -> bool:
        return self.phase == "Pending" and not self.deleted

    @property
    def vmi(self) -> str:
        """The KubeVirt VirtualMachineInstance this pod runs, when it is a virt-launcher pod; "" otherwise."""
        if self.labels.get(KUBEVIRT_APP_LABEL) != VIRT_LAUNCHER:
            return ""
        return self.annotations.get(VMI_DOMAIN_ANNOTATION, "")

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
        claims=pod_claim_names(spec, status),
        priority_class=spec.get("priorityClassName") or "",
    )


def pod_claim_names(spec: dict, status: dict) -> list[str]:
    """The ResourceClaims a pod uses: named ones, and those the resourceclaim controller made from templates
    (`status.resourceClaimStatuses`; a template's claim has a generated name)."""
    names = [c["resourceClaimName"] for c in spec.get("resourceClaims") or () if c.get("resourceClaimName")]
    names += [c["resourceClaimName"] for c in status.get("resourceClaimStatuses") or () if c.get("resourceClaimName")]
    return names


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of a DRA driver's ResourceSlice, with the NVIDIA driver's attributes gpuaas reads.

    `type` is "gpu" or "mig"; `uuid` the GPU or MIG device UUID (what NVML and GpuCapacity/MigInstance
    carry); `profile` and `parent_uuid` only for MIG devices. `pool` is the slice's pool (the node name
    for the NVIDIA driver); (driver, pool, name) is what a claim's allocation result names.
    """

    driver: str
    pool: str
    node_name: str
    name: str
    type: str
    uuid: str
    parent_uuid: str = ""
    profile: str = ""
    product_name: str = ""
    memory: str = ""


def _attribute(device: dict, name: str):
    value = (device.get("attributes") or {}).get(name)
    if not isinstance(value, dict) or not value:
        return None
    return next(iter(value.values()))


def parse_resource_slice(obj: dict) -> list[DraDevice]:
    """The devices of a resource.k8s.io/v1 ResourceSlice (devices without a uuid attribute are skipped)."""
    spec = obj.get("spec") or {}
    driver = spec.get("driver") or ""
    pool = (spec.get("pool") or {}).get("name") or ""
    devices = []
    for device in spec.get("devices") or ():
        uuid = _attribute(device, "uuid")
        if not uuid:
            continue
        devices.append(
            DraDevice(
                driver=driver,
                pool=pool,
                node_name=spec.get("nodeName") or "",
                name=device.get("name") or "",
                type=str(_attribute(device, "type") or ""),
                uuid=str(uuid),
                parent_uuid=str(_attribute(device, "parentUUID") or ""),
                profile=str(_attribute(device, "profile") or ""),
                product_name=str(_attribute(device, "productName") or ""),
                memory=str(((device.get("capacity") or {}).get("memory") or {}).get("value") or ""),
            )
        )
    return devices


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """The parts of a resource.k8s.io/v1 ResourceClaim gpuaas reads: who holds it and what it was given.

    `results` are the allocation's (request, driver, pool, device); `reserved_for` the uids of the pods
    reserving it.
    """

    namespace: str
    name: str
    uid: str
    results: tuple[tuple[str, str, str, str], ...]
    reserved_for: tuple[str, ...]


def parse_resource_claim(obj: dict) -> ResourceClaim:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or ()
    return ResourceClaim(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        results=tuple(
            (r.get("request", ""), r.get("driver", ""), r.get("pool", ""), r.get("device", "")) for r in results
        ),
        reserved_for=tuple(r.get("uid", "") for r in status.get("reservedFor") or () if r.get("resource") == "pods"),
    )
