"""What a node agent sends the control plane: a signed report of one node, as JSON.

Keys: every node has its own key, HMAC-SHA256(AGENT_SIGNING_SECRET, "gpuaas-node-agent" + cluster +
node). The control plane holds the secret and derives any node's key; a node agent holds only its
own node's key (AGENT_NODE_KEY), so a compromised node can sign reports for itself and nobody else
(docs/security.md "Node agents"). A simulated agent that serves many nodes' queues (tests, the
poll-cycle benchmark) is given the secret instead.

A report is a JSON object: v, kind, cluster, node, slot, body, sig. `sig` is the hex HMAC of the
canonical JSON (sorted keys, no spaces) of everything else. Readings travel as plain dicts of the
NVML adapter's dataclasses and are rebuilt field by field; an unknown field is a bad report.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
from typing import Any

from django.conf import settings

from capacity.adapters import nvml, podresources

VERSION = 1
KIND_METRICS = "metrics"
KIND_INVENTORY = "inventory"
# MIG reconfiguration (agent backend): the control plane's command to a node, the node's result.
KIND_MIG_COMMAND = "mig-command"
KIND_MIG_RESULT = "mig-result"


def agent_version() -> str:
    """The release this agent runs (settings.GPUAAS_VERSION), sent in every report's body as `agent`."""
    return settings.GPUAAS_VERSION


def reported_version(body: Any) -> str:
    """The agent release a verified report's body names; "" from an agent older than that field."""
    version = body.get("agent") if isinstance(body, dict) else None
    return version[:64] if isinstance(version, str) else ""


class BadReport(ValueError):
    """A report that is malformed, unsigned, or signed with another node's key."""


def node_key(secret: str, cluster: str, node: str) -> bytes:
    """The key of one node, derived from the shared secret (the NUL separators keep names apart)."""
    return hmac.new(secret.encode(), f"gpuaas-node-agent\0{cluster}\0{node}".encode(), hashlib.sha256).digest()


def signing_key(cluster: str, node: str) -> bytes:
    """The key this process signs `node`'s reports with: its own AGENT_NODE_KEY, else derived from the secret.

    An agent holding one node's key refuses to sign for any other node (it could not be verified anyway).
    """
    if settings.AGENT_NODE_KEY:
        if (cluster, node) != (settings.AGENT_CLUSTER_NAME, settings.AGENT_NODE_NAME):
            raise BadReport(
                f"this agent holds the key of {settings.AGENT_CLUSTER_NAME}/{settings.AGENT_NODE_NAME},"
                f" not of {cluster}/{node}"
            )
        return bytes.fromhex(settings.AGENT_NODE_KEY)
    return node_key(settings.AGENT_SIGNING_SECRET, cluster, node)


def _canonical(fields: dict) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def sign(kind: str, cluster: str, node: str, slot: int, body: dict) -> dict:
    """A signed report of `node` (the body is plain JSON data)."""
    fields = {"v": VERSION, "kind": kind, "cluster": cluster, "node": node, "slot": slot, "body": body}
    sig = hmac.new(signing_key(cluster, node), _canonical(fields), hashlib.sha256).hexdigest()
    return {**fields, "sig": sig}


def verify(report: Any, *, own: bool = False) -> dict:
    """The report if it is well formed and signed with its own node's key; BadReport otherwise.

    The control plane derives the claimed node's key from AGENT_SIGNING_SECRET; `own=True` checks with
    this process's signing key instead (an agent checking a command addressed to its node).
    """
    if not isinstance(report, dict) or set(report) != {"v", "kind", "cluster", "node", "slot", "body", "sig"}:
        raise BadReport("not a report object")
    if report["v"] != VERSION:
        raise BadReport(f"report version {report['v']!r}, this control plane reads {VERSION}")
    cluster, node, slot, sig = report["cluster"], report["node"], report["slot"], report["sig"]
    if not (isinstance(cluster, str) and isinstance(node, str) and isinstance(slot, int) and isinstance(sig, str)):
        raise BadReport("cluster, node, sig must be strings and slot an integer")
    fields = {k: v for k, v in report.items() if k != "sig"}
    try:
        key = signing_key(cluster, node) if own else node_key(settings.AGENT_SIGNING_SECRET, cluster, node)
        expected = hmac.new(key, _canonical(fields), hashlib.sha256).hexdigest()
    except ValueError as exc:  # NaN or infinity in the body: not JSON we sent
        raise BadReport(str(exc)) from None
    if not hmac.compare_digest(expected, sig):
        raise BadReport(f"signature does not match node {cluster}/{node}")
    return report


# --- readings <-> JSON ------------------------------------------------------------------------------


def metrics_body(
    readings: list[nvml.GpuMetrics] | None, *, error: str = "", elapsed_ms: int = 0, pods: str | None = None
) -> dict:
    """`pods`: the kubelet's pod -> device set as podresources.pods_digest fingerprints it (left out when the
    kubelet could not be asked)."""
    body = {"error": error, "ms": elapsed_ms, "gpus": [_plain(r) for r in readings or []], "agent": agent_version()}
    if pods is not None:
        body["pods"] = pods
    return body


def _plain(value: Any) -> Any:
    """dataclasses.asdict for the adapter's readings (dataclasses, lists, plain values), without its deep
    copy of every value: a node's report is hundreds of objects, read every poll."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    names = _ordered_fields(type(value)) if dataclasses.is_dataclass(value) else None
    if names is None:
        return value
    return {name: _plain(getattr(value, name)) for name in names}


@functools.cache
def _ordered_fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _field_names(cls) -> frozenset[str]:
    return frozenset(_ordered_fields(cls))


def _build(cls, data: Any, nested: dict[str, Any]):
    if not isinstance(data, dict):
        raise BadReport(f"{cls.__name__}: not an object")
    if not _field_names(cls).issuperset(data):
        unknown = set(data) - _field_names(cls)
        raise BadReport(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    values = dict(data)
    for name, build in nested.items():
        if values.get(name) is not None:
            if not isinstance(values[name], list):
                raise BadReport(f"{cls.__name__}.{name}: not a list")
            values[name] = [build(item) for item in values[name]]
    try:
        return cls(**values)
    except TypeError as exc:
        raise BadReport(f"{cls.__name__}: {exc}") from None


def _process(data: Any) -> nvml.ProcessInfo:
    return _build(nvml.ProcessInfo, data, {})


def _xid(data: Any) -> nvml.XidEvent:
    return _build(nvml.XidEvent, data, {})


def _mig(data: Any) -> nvml.MigMetrics:
    return _build(nvml.MigMetrics, data, {"processes": _process})


def _vgpu(data: Any) -> nvml.VgpuMetrics:
    return _build(nvml.VgpuMetrics, data, {})


def _gpu(data: Any) -> nvml.GpuMetrics:
    return _build(nvml.GpuMetrics, data, {"mig": _mig, "processes": _process, "xids": _xid, "vgpus": _vgpu})


_METRICS_KEYS = tuple(
    keys | extra for keys in ({"error", "ms", "gpus"}, {"error", "ms", "gpus", "pods"}) for extra in (set(), {"agent"})
)


def metrics_from_body(body: Any) -> tuple[list[nvml.GpuMetrics], str, int]:
    """(readings, error, elapsed_ms) of a metrics report's body; BadReport if it is not what an agent sends."""
    if not isinstance(body, dict) or set(body) not in _METRICS_KEYS or not isinstance(body["gpus"], list):
        raise BadReport("metrics body must be {error, ms, gpus[, pods]}")
    if not isinstance(body.get("pods", ""), str):
        raise BadReport("metrics body: pods must be a string")
    if not isinstance(body["ms"], int) or not isinstance(body["error"], str):
        raise BadReport("metrics body: ms must be an integer and error a string")
    return [_gpu(g) for g in body["gpus"]], body["error"], body["ms"]


def inventory_body(
    inventory: nvml.NodeInventory | None,
    *,
    error: str = "",
    pod_resources: podresources.PodResourcesReading | None = None,
) -> dict:
    body = {
        "error": error,
        "inventory": None if inventory is None else dataclasses.asdict(inventory),
        "agent": agent_version(),
    }
    if pod_resources is not None:
        body["pod_resources"] = dataclasses.asdict(pod_resources)
    return body


_INVENTORY_KEYS = tuple(
    keys | extra
    for keys in ({"error", "inventory"}, {"error", "inventory", "pod_resources"})
    for extra in (set(), {"agent"})
)


def _pod_devices(data: Any) -> podresources.PodDevices:
    pod = _build(podresources.PodDevices, data, {})
    devices = pod.devices
    if not (isinstance(pod.namespace, str) and isinstance(pod.name, str) and isinstance(devices, dict)):
        raise BadReport("PodDevices: namespace and name must be strings and devices an object")
    if not all(isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in devices.values()):
        raise BadReport("PodDevices: devices must map resource names to lists of device ids")
    return pod


def pod_resources_from_body(body: dict) -> podresources.PodResourcesReading | None:
    """The kubelet PodResources reading of an inventory report's body; None from an agent that sends none."""
    data = body.get("pod_resources")
    if data is None:
        return None
    reading = _build(podresources.PodResourcesReading, data, {"pods": _pod_devices})
    if not isinstance(reading.error, str) or not isinstance(reading.warnings, list):
        raise BadReport("PodResourcesReading: error must be a string and warnings a list")
    return reading


def _mig_device(data: Any) -> nvml.MigDeviceInfo:
    return _build(nvml.MigDeviceInfo, data, {"processes": _process})


def _gpu_info(data: Any) -> nvml.GpuInfo:
    return _build(nvml.GpuInfo, data, {"mig_devices": _mig_device, "processes": _process})


def inventory_from_body(body: Any, node: str) -> tuple[nvml.NodeInventory | None, str]:
    """(inventory, error) of an inventory report's body; the inventory must be of the report's own node."""
    if not isinstance(body, dict) or set(body) not in _INVENTORY_KEYS or not isinstance(body["error"], str):
        raise BadReport("inventory body must be {error, inventory[, pod_resources]}")
    pod_resources_from_body(body)
    if body["inventory"] is None:
        return None, body["error"] or "no inventory"
    inventory = _build(nvml.NodeInventory, body["inventory"], {"gpus": _gpu_info})
    if inventory.node_name != node:
        raise BadReport(f"inventory of {inventory.node_name!r} in a report of {node!r}")
    return inventory, body["error"]


# --- MIG commands and results ------------------------------------------------------------------------


def mig_command_from_body(body: Any) -> tuple[str, str, dict[str, dict]]:
    """(command id, product, {gpu index: {mig, placements}}) of a MIG command's body."""
    if not isinstance(body, dict) or set(body) != {"id", "product", "gpus"} or not isinstance(body["gpus"], dict):
        raise BadReport("MIG command body must be {id, product, gpus}")
    for index, gpu in body["gpus"].items():
        if not isinstance(gpu, dict) or set(gpu) != {"mig", "placements"} or not isinstance(gpu["placements"], list):
            raise BadReport(f"MIG command GPU {index}: must be {{mig, placements}}")
    return str(body["id"]), str(body["product"]), body["gpus"]


def mig_result_body(command_id: str, *, applied: dict, error: str, inventory: dict) -> dict:
    return {"id": command_id, "applied": applied, "error": error, "inventory": inventory}


def mig_result_from_body(body: Any) -> tuple[str, dict, str, dict]:
    """(command id, applied per GPU, error, signed inventory report read back) of a MIG result's body."""
    if not isinstance(body, dict) or set(body) != {"id", "applied", "error", "inventory"}:
        raise BadReport("MIG result body must be {id, applied, error, inventory}")
    applied, error, inventory = body["applied"], body["error"], body["inventory"]
    if not (isinstance(applied, dict) and isinstance(error, str) and isinstance(inventory, dict)):
        raise BadReport("MIG result body: applied and inventory must be objects and error a string")
    return str(body["id"]), body["applied"], body["error"], body["inventory"]
