"""A tiny kube-scheduler, the kubelet's device allocation, and the admission plugins
that matter for GPU pods (PodNodeSelector, ResourceQuota).

Scheduling: a pod without `spec.nodeName` is bound to the first node, in name order, that
is Ready, schedulable, matches its nodeSelector / required node affinity (after the
namespace's `scheduler.alpha.kubernetes.io/node-selector` is merged in, as PodNodeSelector
does), tolerates the node's NoSchedule/NoExecute taints and has enough free devices for
every `nvidia.com/*` request. First-fit, not kube-scheduler's scoring: predictable tests
matter more here than spreading. Otherwise the pod stays Pending (PodScheduled=False,
Unschedulable) and is retried whenever devices free up or nodes change. CPU and memory
are not accounted.

Device assignment: the chosen device IDs (GPU UUIDs, MIG UUIDs or `<uuid>::<n>` replica
ids) are recorded on the node (`Node.assigned`, device id -> pod) and nowhere on the pod, as on a
real node: the kubelet's PodResources API tells who holds what (`podresources.py` serves it per node);
the same assignment drives the NVML running processes. `assigned_devices()` reads it for tests.
"""

from __future__ import annotations

import json
import time
import zlib
from decimal import Decimal, InvalidOperation

from kubernetes.utils import parse_quantity

from . import dra, gpuoperator
from .state import Cluster, Node, Record

NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"
_TERMINAL = ("Succeeded", "Failed")


# ----------------------------------------------------------------------------------------
# Pod resource arithmetic


def _quantity(value: object) -> Decimal:
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, InvalidOperation, TypeError):
        raise ValueError(f"quantities must match the regular expression, got {value!r}") from None


def pod_requests(pod: dict) -> dict[str, Decimal]:
    """Effective requests: per container, requests, with limits standing in where only a
    limit is given (the API server defaults requests to limits)."""
    total: dict[str, Decimal] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in merged.items():
            total[name] = total.get(name, Decimal(0)) + _quantity(value)
    return total


def pod_limits(pod: dict) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("limits") or {}).items():
            total[name] = total.get(name, Decimal(0)) + _quantity(value)
    return total


def gpu_requests(pod: dict) -> dict[str, int]:
    return {k: int(v) for k, v in pod_requests(pod).items() if k.startswith("nvidia.com/") and v > 0}


def is_terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in _TERMINAL


def _fmt(q: Decimal) -> str:
    return str(int(q)) if q == q.to_integral_value() else format(q.normalize(), "f")


# ----------------------------------------------------------------------------------------
# ResourceQuota


def quota_problems(obj: dict) -> list[tuple[str, str]]:
    problems = []
    for key, value in ((obj.get("spec") or {}).get("hard") or {}).items():
        try:
            _quantity(value)
        except ValueError as exc:
            problems.append((f"spec.hard[{key}]", f'Invalid value: "{value}": {exc}'))
    return problems


def pod_usage(pod: dict) -> dict[str, Decimal]:
    """What one pod charges against quota keys (pods, requests.*, limits.*, cpu, memory)."""
    usage = {"pods": Decimal(1), "count/pods": Decimal(1)}
    for name, q in pod_requests(pod).items():
        usage[f"requests.{name}"] = q
        if name in ("cpu", "memory", "ephemeral-storage"):
            usage[name] = q
    for name, q in pod_limits(pod).items():
        usage[f"limits.{name}"] = q
    return usage


def quota_used(cluster: Cluster, namespace: str) -> dict[str, Decimal]:
    used: dict[str, Decimal] = {}
    for (ns, _), record in cluster.pods.items():
        if ns == namespace and not is_terminal(record.obj):
            for key, q in pod_usage(record.obj).items():
                used[key] = used.get(key, Decimal(0)) + q
    return used


def render_quota(cluster: Cluster, obj: dict) -> dict:
    hard = (obj.get("spec") or {}).get("hard") or {}
    used = quota_used(cluster, obj["metadata"]["namespace"])
    return {**obj, "status": {"hard": dict(hard), "used": {k: _fmt(used.get(k, Decimal(0))) for k in hard}}}


def check_quota(cluster: Cluster, pod: dict) -> None:
    from .kube import forbidden

    namespace = pod["metadata"]["namespace"]
    usage = pod_usage(pod)
    used = None
    for (ns, qname), record in sorted(cluster.resourcequotas.items()):
        if ns != namespace:
            continue
        hard = (record.obj.get("spec") or {}).get("hard") or {}
        if used is None:
            used = quota_used(cluster, namespace)
        over = sorted(
            key
            for key, limit in hard.items()
            if usage.get(key, 0) > 0 and used.get(key, Decimal(0)) + usage[key] > _quantity(limit)
        )
        if over:
            requested = ",".join(f"{k}={_fmt(usage[k])}" for k in over)
            in_use = ",".join(f"{k}={_fmt(used.get(k, Decimal(0)))}" for k in over)
            limited = ",".join(f"{k}={_fmt(_quantity(hard[k]))}" for k in over)
            raise forbidden(
                "pods",
                pod["metadata"]["name"],
                f"exceeded quota: {qname}, requested: {requested}, used: {in_use}, limited: {limited}",
            )


# ----------------------------------------------------------------------------------------
# Admission and scheduling


def _selector_set(text: str) -> dict[str, str]:
    result = {}
    for part in text.split(","):
        if part.strip():
            key, _, value = part.partition("=")
            result[key.strip()] = value.strip()
    return result


def admit_pod(cluster: Cluster, pod: dict) -> None:
    """Defaults, PodNodeSelector and ResourceQuota admission for a new pod (raises ApiError)."""
    from .kube import forbidden, invalid

    meta, spec = pod["metadata"], pod.setdefault("spec", {})
    try:
        gpu_requests(pod)
    except ValueError as exc:
        raise invalid("Pod", meta["name"], [("spec.containers[0].resources", f"Invalid value: {exc}")]) from None
    ns_record = cluster.namespaces[meta["namespace"]]
    ns_selector = (ns_record.obj["metadata"].get("annotations") or {}).get(NODE_SELECTOR_ANNOTATION)
    if ns_selector:
        wanted = _selector_set(ns_selector)
        selector = spec.get("nodeSelector") or {}
        if any(k in selector and selector[k] != v for k, v in wanted.items()):
            raise forbidden(
                "pods", meta["name"], "pod node label selector conflicts with its namespace node label selector"
            )
        spec["nodeSelector"] = {**selector, **wanted}
    _namespace_tolerations(ns_record.obj, pod)
    check_quota(cluster, pod)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("serviceAccountName", "default")
    requests = pod_requests(pod)
    qos = "BestEffort" if not requests else "Burstable"
    pod["status"] = {"phase": "Pending", "qosClass": qos}


DEFAULT_TOLERATIONS_ANNOTATION = "scheduler.alpha.kubernetes.io/defaultTolerations"
TOLERATIONS_WHITELIST_ANNOTATION = "scheduler.alpha.kubernetes.io/tolerationsWhitelist"


def _same_toleration(a: dict, b: dict) -> bool:
    keys = ("key", "operator", "value", "effect")
    return all(
        (a.get(k) or ("Equal" if k == "operator" else "")) == (b.get(k) or ("Equal" if k == "operator" else ""))
        for k in keys
    )


def _namespace_tolerations(namespace: dict, pod: dict) -> None:
    """The PodTolerationRestriction admission plugin: the namespace's default tolerations are merged into the
    pod's (a pod toleration of the same key and effect wins), then every toleration must be in the
    namespace's whitelist, if it has one, or the pod is refused (403)."""
    from .kube import forbidden

    annotations = namespace["metadata"].get("annotations") or {}
    spec = pod["spec"]
    tolerations = list(spec.get("tolerations") or [])
    defaults = json.loads(annotations.get(DEFAULT_TOLERATIONS_ANNOTATION) or "[]")
    for default in defaults:
        if not any(
            t.get("key") == default.get("key") and t.get("effect") == default.get("effect") for t in tolerations
        ):
            tolerations.append(dict(default))
    if tolerations:
        spec["tolerations"] = tolerations
    whitelist = annotations.get(TOLERATIONS_WHITELIST_ANNOTATION)
    if whitelist is None:
        return
    allowed = json.loads(whitelist or "[]")
    if any(not any(_same_toleration(t, a) for a in allowed) for t in tolerations):
        raise forbidden(
            "pods",
            pod["metadata"]["name"],
            "pod tolerations (possibly merged with namespace default "
            "tolerations) conflict with its namespace whitelist",
        )


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    if taint.get("effect") == "PreferNoSchedule":
        return True
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol["key"] == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _fit(node: Node, pod: dict, requests: dict[str, int]) -> str | None:
    """None if the pod fits on the node, else the scheduler's reason."""
    from .kube import node_selector_terms_match

    spec = pod.get("spec") or {}
    if not node.ready:
        return "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    if node.unschedulable and not _tolerated(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, spec.get("tolerations") or []
    ):
        return "node(s) were unschedulable"
    selector = spec.get("nodeSelector") or {}
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return "node(s) didn't match Pod's node affinity/selector"
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        or {}
    ).get("nodeSelectorTerms") or []
    if not node_selector_terms_match(terms, node.labels):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in node.taints:
        if taint.get("key") != "node.kubernetes.io/unschedulable" and not _tolerated(
            taint, spec.get("tolerations") or []
        ):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    for resource, count in requests.items():
        free = sum(1 for d in node.devices.get(resource, ()) if d not in node.assigned)
        if free < count:
            return f"Insufficient {resource}"
    return None


def _pod_key(pod: dict) -> tuple[str, str]:
    return pod["metadata"]["namespace"], pod["metadata"]["name"]


def _claim_statuses(pod: dict) -> dict:
    """The resourceclaim controller's part of a pod's status, kept across the kubelet's rewrites."""
    kept = (pod.get("status") or {}).get("resourceClaimStatuses")
    return {"resourceClaimStatuses": kept} if kept else {}


def _set_running(cluster: Cluster, record: Record, node: Node) -> None:
    pod = record.obj
    now = cluster.state.timestamp()
    serial = zlib.crc32(pod["metadata"]["uid"].encode())
    pod_ip = node.pod_cidr.replace(".0/24", f".{2 + serial % 250}")
    pod["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "hostIP": node.address,
        "hostIPs": [{"ip": node.address}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": now,
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"containerd://{serial:08x}{i:056x}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for i, c in enumerate(pod["spec"].get("containers") or [])
        ],
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
        **_claim_statuses(pod),
    }


def _set_creating(cluster: Cluster, record: Record, node: Node) -> None:
    """Bound, devices allocated, containers not started yet: what kubelet reports while it pulls
    images and the device plugin's Allocate runs (`kubectl` shows ContainerCreating)."""
    pod = record.obj
    now = cluster.state.timestamp()
    names = [c["name"] for c in pod["spec"].get("containers") or []]
    unready = f"containers with unready status: [{' '.join(names)}]"
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "False", "lastProbeTime": None, "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": now},
            {
                "type": "Ready",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": now,
                "reason": "ContainersNotReady",
                "message": unready,
            },
            {
                "type": "ContainersReady",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": now,
                "reason": "ContainersNotReady",
                "message": unready,
            },
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now},
        ],
        "hostIP": node.address,
        "hostIPs": [{"ip": node.address}],
        "startTime": now,
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
            for c in pod["spec"].get("containers") or []
        ],
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
        **_claim_statuses(pod),
    }


def _set_failed(cluster: Cluster, record: Record, node: Node, reason: str, message: str) -> None:
    pod = record.obj
    pod["status"] = {
        "phase": "Failed",
        "reason": reason,
        "message": message,
        "hostIP": node.address,
        "startTime": cluster.state.timestamp(),
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
    }


def bind(cluster: Cluster, record: Record, node: Node) -> None:
    """Bind the pod to the node and let the 'kubelet' allocate devices and start it."""
    pod = record.obj
    pod["spec"]["nodeName"] = node.name
    requests = gpu_requests(pod)
    sharing = node.sharing
    if sharing is not None and sharing.fail_requests_greater_than_one:
        for resource, count in requests.items():
            base = resource[: -len(".shared")] if resource.endswith(".shared") else resource
            if count > 1 and sharing.replicas_for(base) > 1:
                _set_failed(
                    cluster,
                    record,
                    node,
                    "UnexpectedAdmissionError",
                    "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = request for "
                    f"'{resource}: {count}' too large: maximum request size for shared resources is 1",
                )
                return
    for resource, count in requests.items():
        free = [d for d in node.devices.get(resource, ()) if d not in node.assigned]
        if len(free) < count:
            _set_failed(
                cluster,
                record,
                node,
                f"OutOf{resource}",
                f"Pod was rejected: Node didn't have enough resource: {resource}, requested: {count}, "
                f"used: {len(node.devices.get(resource, ())) - len(free)}, "
                f"capacity: {len(node.devices.get(resource, ()))}",
            )
            return
    key = _pod_key(pod)
    for resource in sorted(requests):
        free = [d for d in node.devices.get(resource, ()) if d not in node.assigned][: requests[resource]]
        for device_id in free:
            node.assigned[device_id] = key
    delay = cluster.state.api.pod_start_delay_s
    if delay > 0:
        _set_creating(cluster, record, node)
        cluster.pod_timers[key] = (time.monotonic() + delay, "start")
    else:
        _set_running(cluster, record, node)


def _unschedulable(cluster: Cluster, record: Record, message: str) -> bool:
    status = record.obj.setdefault("status", {})
    status["phase"] = "Pending"
    status["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "lastProbeTime": None,
            "lastTransitionTime": cluster.state.timestamp(),
            "reason": "Unschedulable",
            "message": message,
        }
    ]
    record.raw = None
    return False


def schedule(cluster: Cluster, record: Record) -> bool:
    """Try to place a pending pod; True when bound. A pod with resource claims also needs every claim
    allocated on the node (simcluster.dra), else that node counts as "cannot allocate all claims"."""
    pod = record.obj
    requests = gpu_requests(pod)
    claims: list[Record] = []
    if dra.pod_claims(pod):
        claims, waiting = dra.ensure_claims(cluster, record)
        if waiting:
            return _unschedulable(cluster, record, f"0/{len(cluster.nodes)} nodes are available: {waiting}.")
    reasons: dict[str, int] = {}
    for name in cluster.node_names():
        node = cluster.nodes[name]
        why = _fit(node, pod, requests)
        picks = None
        if why is None and claims:
            picks = dra.plan(cluster, node, pod, claims)
            why = dra.CANNOT_ALLOCATE if picks is None else None
        if why is None:
            if claims:
                dra.commit(cluster, node, record, claims, picks)
            bind(cluster, record, node)
            pod["metadata"]["resourceVersion"] = cluster.bump()
            record.raw = None
            cluster.record_event("MODIFIED", "pods", _pod_key(pod), record)
            return True
        reasons[why] = reasons.get(why, 0) + 1
    detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return _unschedulable(
        cluster, record, f"0/{len(cluster.nodes)} nodes are available" + (f": {detail}." if detail else ".")
    )


def on_pod_created(cluster: Cluster, record: Record) -> None:
    node_name = record.obj["spec"].get("nodeName")
    if not node_name:
        schedule(cluster, record)
        return
    node = cluster.nodes.get(node_name)
    if node is None:
        # Like a pod bound to a node that does not exist: it stays Pending forever.
        return
    bind(cluster, record, node)
    record.raw = None


def terminate(cluster: Cluster, record: Record, grace_s: int | None) -> bool:
    """Start a graceful delete; True when the pod now stays Terminating (else delete it at once).

    Like kube-apiserver, the pod gets deletionTimestamp = now + grace and stays listed, with its
    containers (and devices) until the kubelet has stopped them: the requested grace period, else
    the pod's terminationGracePeriodSeconds, but never longer than the `pod_termination_grace_s` knob.
    A pod never bound to a node, or already finished, goes at once, as on a real cluster.
    """
    pod = record.obj
    grace = grace_s if grace_s is not None else int(pod["spec"].get("terminationGracePeriodSeconds", 30))
    wait = min(float(grace), cluster.state.api.pod_termination_grace_s)
    if wait <= 0 or not pod["spec"].get("nodeName") or is_terminal(pod):
        return False
    key = _pod_key(pod)
    due = time.monotonic() + wait
    current = cluster.pod_timers.get(key)
    if current is not None and current[1] == "gone":
        if due >= current[0]:
            return True  # a second delete may shorten the grace period, never lengthen it
    else:
        meta = pod["metadata"]
        meta["deletionTimestamp"] = cluster.state.timestamp_in(grace)
        meta["deletionGracePeriodSeconds"] = grace
    cluster.pod_timers[key] = (due, "gone")
    pod["metadata"]["resourceVersion"] = cluster.bump()
    record.raw = None
    cluster.record_event("MODIFIED", "pods", key, record)
    return True


def run_pod_timers(cluster: Cluster, now: float, *, force: bool = False) -> None:
    """The kubelet's side of pod phases: start pods whose start delay is over, remove Terminating
    pods whose grace period is over (freeing their devices)."""
    due = [(key, action) for key, (when, action) in cluster.pod_timers.items() if force or when <= now]
    for key, action in sorted(due):
        del cluster.pod_timers[key]
        record = cluster.pods.get(key)
        if record is None:
            continue
        if action == "start":
            node = cluster.nodes.get(record.obj["spec"].get("nodeName") or "")
            if node is None or (record.obj.get("status") or {}).get("phase") != "Pending":
                continue
            _set_running(cluster, record, node)
            record.obj["metadata"]["resourceVersion"] = cluster.bump()
            record.raw = None
            cluster.record_event("MODIFIED", "pods", key, record)
        else:
            remove_pod(cluster, key)


def remove_pod(cluster: Cluster, key: tuple[str, str]) -> dict:
    """Take the pod out of the store for good: DELETED event, devices freed, pending pods retried."""
    record = cluster.pods.pop(key)
    cluster.pod_timers.pop(key, None)
    obj = record.obj
    obj["metadata"]["resourceVersion"] = cluster.bump()
    cluster.record_event("DELETED", "pods", key, json.dumps(obj, separators=(",", ":")).encode())
    on_pod_deleted(cluster, obj)
    gpuoperator.on_pod_deleted(cluster, obj)  # the DaemonSet recreates a device plugin pod once the old one is gone
    return obj


def assigned_devices(cluster: Cluster, namespace: str, name: str) -> list[str]:
    """The device ids the simulated kubelet gave the pod, in allocation order (what PodResources lists)."""
    pod = cluster.pods[(namespace, name)].obj
    node = cluster.nodes.get((pod.get("spec") or {}).get("nodeName") or "")
    return [d for d, owner in node.assigned.items() if owner == (namespace, name)] if node else []


def release(cluster: Cluster, pod: dict) -> None:
    node = cluster.nodes.get((pod.get("spec") or {}).get("nodeName") or "")
    if node is None:
        return
    key = _pod_key(pod)
    for device_id in [d for d, owner in node.assigned.items() if owner == key]:
        del node.assigned[device_id]


def on_pod_deleted(cluster: Cluster, pod: dict) -> None:
    release(cluster, pod)
    dra.on_pod_gone(cluster, pod)
    retry_pending(cluster)


def retry_pending(cluster: Cluster) -> None:
    """Give unscheduled pods another chance, oldest first (by resourceVersion of creation)."""
    pending = [
        r
        for r in cluster.pods.values()
        if not r.obj["spec"].get("nodeName") and (r.obj.get("status") or {}).get("phase") == "Pending"
    ]
    for record in sorted(pending, key=lambda r: (r.obj["metadata"]["creationTimestamp"], r.obj["metadata"]["uid"])):
        schedule(cluster, record)


# ----------------------------------------------------------------------------------------
# What runs on a node (mig-manager refusal, NVML processes, metric model)


def gpu_pods_on_node(cluster: Cluster, node_name: str) -> list[str]:
    """Non-operator, non-terminal pods on the node that request nvidia.com/* resources."""
    operator_ns = cluster.settings.operator_namespace
    found = []
    for (ns, name), record in sorted(cluster.pods.items()):
        pod = record.obj
        if ns == operator_ns or pod["spec"].get("nodeName") != node_name or is_terminal(pod):
            continue
        if gpu_requests(pod) or dra.pod_claims(pod):
            found.append(f"{ns}/{name}")
    return found


def device_owners(node: Node) -> dict[str, tuple[int, int | None]]:
    """Device UUID -> (GPU index, GI id or None)."""
    owners: dict[str, tuple[int, int | None]] = {}
    for gpu in node.gpus:
        owners[gpu.uuid] = (gpu.index, None)
        for gi, ci in gpu.mig_devices():
            owners[ci.uuid] = (gpu.index, gi.id)
    return owners


def workload_character(record: Record | None) -> str:
    """A pod's workload character: its `gpuaas.io/workload-type` label, else "batch"."""
    from .hardware import CHARACTERS, WORKLOAD_TYPE_LABEL

    labels = (record.obj.get("metadata", {}).get("labels") or {}) if record is not None else {}
    value = labels.get(WORKLOAD_TYPE_LABEL, "batch")
    return value if value in CHARACTERS else "batch"


def unit_work(cluster: Cluster, node: Node) -> dict[int, dict[int | None, str]]:
    """GPU index -> {unit with a pod on it (GI id, or None for the whole GPU): the pod's character}."""
    if not node.assigned:
        return {}
    owners = device_owners(node)
    work: dict[int, dict[int | None, str]] = {}
    for device_id, key in sorted(node.assigned.items()):
        owner = owners.get(device_id.split("::")[0])
        if owner is not None:
            work.setdefault(owner[0], {}).setdefault(owner[1], workload_character(cluster.pods.get(key)))
    return work


SIM_SM_UTIL_ANNOTATION = "gpuaas.io/sim-sm-util"


def _sm_util(record, fraction: float, replicas: int) -> int:
    forced = (record.obj["metadata"].get("annotations") or {}).get(SIM_SM_UTIL_ANNOTATION)
    if forced is not None and str(forced).isdigit():
        return min(100, int(forced))
    return int(100 * fraction / replicas)


def processes(cluster: Cluster, node: Node) -> list[dict]:
    """The compute processes NVML reports: one per assigned device, memory in bytes."""
    owners = device_owners(node)
    result = []
    for device_id, key in sorted(node.assigned.items()):
        record = cluster.pods.get(key)
        owner = owners.get(device_id.split("::")[0])
        if record is None or owner is None:
            continue
        gpu = node.gpu(owner[0])
        unit_mib = gpu.instances[owner[1]].profile.memory_mib if owner[1] is not None else gpu.product.memory_mib
        replicas = node.sharing.replicas_for("nvidia.com/gpu") if node.sharing and "::" in device_id else 1
        seed = zlib.crc32(f"{record.obj['metadata']['uid']}/{device_id}".encode())
        fraction = 0.3 + 0.5 * (seed % 1000) / 1000
        result.append(
            {
                "gpu": owner[0],
                "gi": owner[1],
                "pid": 2000 + seed % 60000,
                "used_bytes": int(unit_mib * fraction / replicas) * 1024 * 1024,
                # SM utilisation as nvmlDeviceGetProcessUtilization reports it: within the pod's share, unless
                # the pod is annotated gpuaas.io/sim-sm-util (a greedy tenant, for the over-use checks).
                "sm_util": _sm_util(record, fraction, replicas),
                "pod": f"{key[0]}/{key[1]}",
                "pod_uid": record.obj["metadata"]["uid"],
                "device": device_id,
            }
        )
    return result
