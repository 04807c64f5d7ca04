"""Dynamic Resource Allocation (resource.k8s.io/v1) as NVIDIA's DRA driver for GPUs and kube-scheduler do it.

Knob: `ClusterSettings.dra = True`. Then, as on a cluster that runs the NVIDIA DRA driver for GPUs
(docs/dra.md, facts and sources):

- the device plugin is off (nodes advertise no `nvidia.com/*` extended resources; GFD labels stay);
- the driver's kubelet plugin publishes one ResourceSlice per node (driver `gpu.nvidia.com`, pool = node
  name) listing each whole GPU (MIG off) as `gpu-<minor>` and each MIG device as
  `gpu-<minor>-mig-<GI profile id>-<placement start>-<placement size>`, with the driver's attribute names
  (`type`, `uuid`, `parentUUID`, `profile`, `productName`, `brand`, `architecture`,
  `cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`, `pcieBusID`) and capacities; it is
  rewritten (generation + 1) whenever the node's devices change (MIG manager, lost GPU);
- the DeviceClasses `gpu.nvidia.com` and `mig.nvidia.com` exist (selector on `type`);
- the resourceclaim controller creates a pod's ResourceClaim from its ResourceClaimTemplate
  (`<pod>-<claim>-<5 chars>`, owned by the pod, `status.resourceClaimStatuses` on the pod) and deletes it
  when the pod is gone;
- the scheduler allocates, on the node it tries, for every request of every claim, devices of that
  node's slice that the request's DeviceClass selectors AND its own selectors admit and that no other
  claim (nor a running pod) holds; it writes `status.allocation.devices.results[]` (request, driver,
  pool, device), the node selector and `status.reservedFor`. A pod whose claims cannot be allocated on
  any node stays Pending: PodScheduled=False, Unschedulable, "0/N nodes are available: N cannot
  allocate all claims." (kube-scheduler's dynamicresources plugin wording).

CEL: through a maintained CEL implementation (simcluster/cel.py: common-expression-language). A selector
is compiled when its object is written; one that does not compile, references anything but `device` and
its declared fields, or calls a Kubernetes CEL library function the library lacks, is refused then (422
with the expression and why), never admitted silently. A selector naming an attribute the device lacks
does not match (the real evaluator fails the allocation with an error: either way no device is given).
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass

from . import admission, cel
from .cel import CelError
from .state import Cluster, Node, Record

DRIVER = "gpu.nvidia.com"
GROUP = "resource.k8s.io"
API_VERSION = "resource.k8s.io/v1"
POD_CLAIM_NAME_ANNOTATION = admission.POD_CLAIM_NAME_ANNOTATION
CANNOT_ALLOCATE = "cannot allocate all claims"
# The driver's DeviceClasses (deployments/helm/nvidia-dra-driver-gpu templates; docs/dra.md).
DEVICE_CLASSES = {
    "gpu.nvidia.com": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'",
    "mig.nvidia.com": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'",
}
# NVML_DEVICE_ARCH_* -> the name the driver publishes in `architecture`.
_ARCHITECTURES = {5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}


# ----------------------------------------------------------------------------------------
# CEL: through the maintained library behind simcluster/cel.py


class Selector:
    """A compiled CEL device selector (refused with CelError where kube-apiserver's compile would refuse it)."""

    def __init__(self, expression: str):
        self.expression = expression
        self.program = cel.device_selector(expression)

    def admits(self, driver: str, device: dict) -> bool:
        """True only when the expression evaluates to true; an evaluation error (an attribute the device lacks)
        admits nothing, as the real allocator fails the allocation with that error."""
        try:
            return self.program.execute({"device": cel.device_activation(driver, device)}) is True
        except (KeyError, TypeError, ValueError, RuntimeError):
            return False


@functools.lru_cache(maxsize=4096)
def compiled(expression: str) -> Selector:
    """A selector compiled once per expression (the allocator evaluates the same ones on every node)."""
    return Selector(expression)


def selector_problems(requests_or_class: list[dict], field: str) -> list[tuple[str, str]]:
    """422 causes for selectors outside the subset: [(field, message)]."""
    problems = []
    for i, item in enumerate(requests_or_class):
        expression = ((item or {}).get("cel") or {}).get("expression")
        try:
            compiled(expression)
        except CelError as exc:
            problems.append(
                (f"{field}[{i}].cel.expression", f"Invalid value: {expression!r}: compilation failed: {exc}")
            )
    return problems


def _claim_spec_problems(spec: dict, field: str) -> list[tuple[str, str]]:
    requests = ((spec or {}).get("devices") or {}).get("requests")
    if not isinstance(requests, list) or not requests:
        return [(f"{field}.devices.requests", "Required value")]
    problems = []
    for i, req in enumerate(requests):
        here = f"{field}.devices.requests[{i}]"
        exactly = (req or {}).get("exactly")
        if not (req or {}).get("name"):
            problems.append((f"{here}.name", "Required value"))
        if not isinstance(exactly, dict) or not exactly.get("deviceClassName"):
            problems.append(
                (f"{here}.exactly.deviceClassName", "Required value (simcluster serves `exactly` requests only)")
            )
            continue
        mode = exactly.get("allocationMode", "ExactCount")
        if mode not in ("ExactCount", "All"):
            problems.append((f"{here}.exactly.allocationMode", f'Unsupported value: "{mode}"'))
        problems += selector_problems(exactly.get("selectors") or [], f"{here}.exactly.selectors")
    return problems


def validate(plural: str, obj: dict) -> list[tuple[str, str]]:
    """What kube-apiserver's validation (and CEL compilation) refuses for the DRA kinds."""
    spec = obj.get("spec") or {}
    if plural == "deviceclasses":
        return selector_problems(spec.get("selectors") or [], "spec.selectors")
    if plural == "resourceclaims":
        return _claim_spec_problems(spec, "spec")
    if plural == "resourceclaimtemplates":
        return _claim_spec_problems(spec.get("spec") or {}, "spec.spec")
    return []


# ----------------------------------------------------------------------------------------
# The driver: DeviceClasses and ResourceSlices


def _quantity_mib(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def _version(text: str, parts: int = 3) -> str:
    numbers = [str(int(p)) for p in re.findall(r"\d+", text)][:parts]
    return ".".join(numbers + ["0"] * (parts - len(numbers)))


def node_devices(cluster: Cluster, node: Node) -> list[dict]:
    """The devices the driver's kubelet plugin publishes for the node now (lost GPUs are left out)."""
    settings = cluster.settings
    devices = []
    for gpu in node.gpus:
        if gpu.lost:
            continue
        product = gpu.product
        common = {
            "productName": {"string": product.model_name},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": _ARCHITECTURES.get(product.architecture, "Unknown")},
            "cudaComputeCapability": {"version": f"{product.compute_major}.{product.compute_minor}.0"},
            "driverVersion": {"version": _version(settings.driver_version)},
            "cudaDriverVersion": {"version": _version(settings.cuda_version)},
        }
        if not gpu.mig_enabled:
            devices.append(
                {
                    "name": f"gpu-{gpu.index}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": gpu.uuid},
                        **common,
                        "pcieBusID": {"string": gpu.pci_bus_id.lower()[4:]},
                    },
                    "capacity": {"memory": {"value": _quantity_mib(product.memory_mib)}},
                }
            )
            continue
        for gi, ci in gpu.mig_devices():
            profile = gi.profile
            if ci.slices != profile.compute_slices:
                continue
            capacity = {
                "copyEngines": {"value": str(profile.copy_engines)},
                "decoders": {"value": str(profile.decoders)},
                "encoders": {"value": str(profile.encoders)},
                "jpegEngines": {"value": str(profile.jpegs)},
                "memory": {"value": _quantity_mib(profile.memory_mib)},
                "multiprocessors": {"value": str(profile.multiprocessors)},
                "ofaEngines": {"value": str(profile.ofas)},
            }
            for s in range(gi.start, gi.start + profile.memory_slices):
                capacity[f"memorySlice{s}"] = {"value": "1"}
            devices.append(
                {
                    "name": f"gpu-{gpu.index}-mig-{profile.profile_id}-{gi.start}-{profile.memory_slices}",
                    "attributes": {
                        "type": {"string": "mig"},
                        "uuid": {"string": ci.uuid},
                        "parentUUID": {"string": gpu.uuid},
                        "profile": {"string": profile.name},
                        **common,
                        "pcieBusID": {"string": gpu.pci_bus_id.lower()[4:]},
                    },
                    "capacity": capacity,
                }
            )
    return devices


def slice_name(cluster: Cluster, node: Node) -> str:
    return f"{node.name}-{DRIVER}-{node.uid[-5:]}"


def bootstrap(cluster: Cluster) -> None:
    """The driver's Helm chart installs its DeviceClasses."""
    from .kube import ClusterApi

    api = ClusterApi(cluster)
    for name, expression in DEVICE_CLASSES.items():
        api.create(
            "deviceclasses",
            None,
            {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}},
        )


def publish(cluster: Cluster, node: Node) -> None:
    """The kubelet plugin (re)publishes the node's ResourceSlice when its devices changed."""
    if not cluster.settings.dra:
        return
    name = slice_name(cluster, node)
    devices = node_devices(cluster, node)
    record = cluster.resourceslices.get(name)
    if record is not None and record.obj["spec"]["devices"] == devices:
        return
    generation = (record.obj["spec"]["pool"]["generation"] + 1) if record is not None else 1
    obj = {
        "kind": "ResourceSlice",
        "apiVersion": API_VERSION,
        "metadata": {
            "name": name,
            "generateName": f"{node.name}-{DRIVER}-",
            "uid": record.obj["metadata"]["uid"] if record else cluster.new_uid("resourceslice", node.name),
            "creationTimestamp": record.obj["metadata"]["creationTimestamp"] if record else cluster.state.timestamp(),
            "generation": generation,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid, "controller": True}
            ],
            "resourceVersion": cluster.bump(),
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    new = Record(obj)
    cluster.resourceslices[name] = new
    cluster.record_event("MODIFIED" if record else "ADDED", "resourceslices", name, new)
    retry = record is not None
    if retry:
        from .scheduler import retry_pending

        retry_pending(cluster)


# ----------------------------------------------------------------------------------------
# Claims: the resourceclaim controller and the scheduler's allocator


def pod_claims(pod: dict) -> list[dict]:
    return [c for c in (pod.get("spec") or {}).get("resourceClaims") or () if isinstance(c, dict)]


def _claim_name_for(pod: dict, entry: dict) -> str | None:
    if entry.get("resourceClaimName"):
        return entry["resourceClaimName"]
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        if status.get("name") == entry.get("name"):
            return status.get("resourceClaimName")
    return None


def ensure_claims(cluster: Cluster, record: Record) -> tuple[list[Record], str | None]:
    """The resourceclaim controller's part: a claim per template reference (created once, owned by the
    pod). Returns the pod's claims, or a reason why it must wait."""
    from .kube import ClusterApi

    pod = record.obj
    namespace, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    claims = []
    for entry in pod_claims(pod):
        name = _claim_name_for(pod, entry)
        if name is None:
            template = cluster.resourceclaimtemplates.get((namespace, entry.get("resourceClaimTemplateName") or ""))
            if template is None:
                return [], (
                    f'resourceclaimtemplate.resource.k8s.io "{entry.get("resourceClaimTemplateName")}" not found'
                )
            body = copy.deepcopy(template.obj["spec"])
            meta = body.get("metadata") or {}
            generated = f"{pod_name}-{entry['name']}"[:57] + "-" + cluster.new_uid("claim", pod_name)[-5:]
            body["metadata"] = {
                "name": generated,
                "labels": meta.get("labels") or {},
                "annotations": {**(meta.get("annotations") or {}), POD_CLAIM_NAME_ANNOTATION: entry["name"]},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod_name,
                        "uid": pod["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            }
            ClusterApi(cluster, user=admission.CLAIM_CONTROLLER).create("resourceclaims", namespace, body)
            status = pod.setdefault("status", {}).setdefault("resourceClaimStatuses", [])
            status.append({"name": entry["name"], "resourceClaimName": generated})
            name = generated
        claim = cluster.resourceclaims.get((namespace, name))
        if claim is None:
            return [], f'resourceclaim "{name}" not found'
        claims.append(claim)
    return claims, None


@dataclass
class _Pick:
    claim: Record
    results: list[dict]
    devices: list[str]  # uuids


def held_devices(cluster: Cluster, node: Node) -> set[str]:
    """Device names of the node's pool that an allocated claim holds. Computed for all pools at once and kept
    until the cluster's resourceVersion moves (every write moves it), so scheduling over many nodes reads the
    claims once."""
    cached = cluster._dra_held
    if cached is None or cached[0] != cluster.rv:
        by_pool: dict[str, set[str]] = {}
        for claim in cluster.resourceclaims.values():
            for result in (((claim.obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            ) or ():
                by_pool.setdefault(result.get("pool"), set()).add(result.get("device"))
        cached = cluster._dra_held = (cluster.rv, by_pool)
    return set(cached[1].get(node.name, ()))


def plan(cluster: Cluster, node: Node, pod: dict, claims: list[Record]) -> list[_Pick] | None:
    """Devices on `node` for every unallocated claim of the pod; None if some request cannot be met."""
    slice_record = cluster.resourceslices.get(slice_name(cluster, node))
    devices = slice_record.obj["spec"]["devices"] if slice_record else []
    held = held_devices(cluster, node)
    in_use = {d.split("::")[0] for d in node.assigned}
    picks = []
    for claim in claims:
        allocation = (claim.obj.get("status") or {}).get("allocation")
        if allocation:
            pools = {r.get("pool") for r in (allocation.get("devices") or {}).get("results") or ()}
            if pools and pools != {node.name}:
                return None  # an allocated claim pins the pod to its node
            continue
        results, uuids = [], []
        for request in claim.obj["spec"]["devices"]["requests"]:
            exactly = request["exactly"]
            device_class = cluster.deviceclasses.get(exactly["deviceClassName"])
            if device_class is None:
                return None
            selectors = [
                compiled(s["cel"]["expression"]) for s in (device_class.obj.get("spec") or {}).get("selectors") or ()
            ] + [compiled(s["cel"]["expression"]) for s in exactly.get("selectors") or ()]
            admitted = [
                d
                for d in devices
                if d["name"] not in held
                and d["attributes"]["uuid"]["string"] not in in_use
                and all(s.admits(DRIVER, d) for s in selectors)
            ]
            want = len(admitted) if exactly.get("allocationMode") == "All" else int(exactly.get("count", 1))
            if want < 1 or len(admitted) < want:
                return None
            for device in admitted[:want]:
                held.add(device["name"])
                uuids.append(device["attributes"]["uuid"]["string"])
                results.append(
                    {"request": request["name"], "driver": DRIVER, "pool": node.name, "device": device["name"]}
                )
        picks.append(_Pick(claim, results, uuids))
    return picks


def commit(cluster: Cluster, node: Node, record: Record, claims: list[Record], picks: list[_Pick]) -> None:
    """Write the allocations and reservations, and give the pod's containers the devices (NVML processes)."""
    pod = record.obj
    key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
    fresh = {id(p.claim): p for p in picks}
    for claim in claims:
        status = claim.obj.setdefault("status", {})
        pick = fresh.get(id(claim))
        if pick is not None:
            status["allocation"] = {
                "devices": {"results": pick.results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
                    ]
                },
                "allocationTimestamp": cluster.state.timestamp(),
            }
        reserved = status.setdefault("reservedFor", [])
        if not any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
            reserved.append({"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]})
        for uuid in _claim_uuids(cluster, claim.obj):
            node.assigned.setdefault(uuid, key)
        _changed(cluster, claim)


def _claim_uuids(cluster: Cluster, claim: dict) -> list[str]:
    uuids = []
    for result in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ():
        node = cluster.nodes.get(result.get("pool", ""))
        record = cluster.resourceslices.get(slice_name(cluster, node)) if node else None
        for device in record.obj["spec"]["devices"] if record else ():
            if device["name"] == result.get("device"):
                uuids.append(device["attributes"]["uuid"]["string"])
    return uuids


def _changed(cluster: Cluster, claim: Record) -> None:
    meta = claim.obj["metadata"]
    meta["resourceVersion"] = cluster.bump()
    claim.raw = None
    cluster.record_event("MODIFIED", "resourceclaims", (meta["namespace"], meta["name"]), claim)


def on_pod_gone(cluster: Cluster, pod: dict) -> None:
    """The pod's reservations end; claims it owned are deleted, claims no pod reserves are deallocated."""
    from .kube import ClusterApi

    if not pod_claims(pod):
        return
    namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
    for key, claim in sorted(cluster.resourceclaims.items()):
        if key[0] != namespace:
            continue
        meta = claim.obj["metadata"]
        if any(o.get("uid") == uid for o in meta.get("ownerReferences") or ()):
            ClusterApi(cluster).delete("resourceclaims", namespace, meta["name"])
            continue
        status = claim.obj.get("status") or {}
        reserved = [r for r in status.get("reservedFor") or () if r.get("uid") != uid]
        if len(reserved) != len(status.get("reservedFor") or ()):
            status["reservedFor"] = reserved
            if not reserved:
                status.pop("allocation", None)
            _changed(cluster, claim)
