"""The node-side half of the fake NVML: what the NVIDIA driver on a node answers.

`node_snapshot()` is a JSON-able picture of one node's GPUs (static facts, MIG layout,
metrics, processes, event-queue head); `nvml_op()` performs MIG writes; `wait_events()`
long-polls the node's event queue. The HTTP endpoint `/sim/v1/nodes/<node>/nvml` and the
in-process backend of simcluster.nvml both call these, so both transports behave alike.

A write changes node state the way the stack follows it: GFD labels the new instances; the
device plugin advertises them at once in the kind world, and only after its pod restarts
with SimState.device_plugin_restart (the real plugin never re-reads NVML on its own).
"""

from __future__ import annotations

import time

from capacity.vgpu import VGPU_TYPES

from . import gpuoperator, scheduler, vgpudm
from .hardware import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_IN_USE,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_SUCCESS,
    Gpu,
    GpuInstance,
    HardwareError,
    reserved_mib,
)
from .state import Cluster, Node, SimState

MIB = 1024 * 1024


class NodeGone(LookupError):
    """The node is not (or no longer) in the cluster."""


def gpu_reserved_mib(gpu: Gpu) -> int:
    """The driver's memory on a GPU with nothing running: its own reservation, or with MIG on its instances'."""
    if gpu.mig_enabled:
        return sum(reserved_mib(gpu.product, gi.profile) for gi in gpu.instances.values())
    return reserved_mib(gpu.product)


def unit_memory_mib(cluster: Cluster, node: Node) -> dict[tuple[int, int | None], int]:
    """(GPU index, GI id or None) -> memory in use as NVML's nvmlDeviceGetMemoryInfo reports it (processes plus
    the driver's reservation), for every GPU and GPU instance of the node."""
    used: dict[tuple[int, int | None], int] = {}
    for proc in scheduler.processes(cluster, node):
        used[(proc["gpu"], proc["gi"])] = used.get((proc["gpu"], proc["gi"]), 0) + proc["used_bytes"]
    found = {}
    for gpu in node.gpus:
        on_gpu = sum(b for (g, _), b in used.items() if g == gpu.index)
        found[(gpu.index, None)] = (on_gpu // MIB) + gpu_reserved_mib(gpu)
        for gi in gpu.instances.values():
            found[(gpu.index, gi.id)] = used.get((gpu.index, gi.id), 0) // MIB + reserved_mib(gpu.product, gi.profile)
    return found


def _cuda_int(version: str) -> int:
    major, _, minor = version.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


def _vgpu_fb_used(used_bytes: int, gpu_mib: int, vgpu_type: str) -> int:
    """A VM's framebuffer in use: the pod's share of the GPU's memory, taken of its vGPU's framebuffer instead."""
    vgpu = VGPU_TYPES.get(vgpu_type)
    if vgpu is None or not gpu_mib:
        return used_bytes
    return used_bytes * vgpu.framebuffer_gb * 1024 // gpu_mib


def node_snapshot(cluster: Cluster, node: Node) -> dict:
    processes = scheduler.processes(cluster, node)
    vgpu_type = vgpudm.applied_type(node)
    gpus = []
    for gpu in node.gpus:
        procs = [p for p in processes if p["gpu"] == gpu.index]
        instances = []
        for gi_id in sorted(gpu.instances):
            gi = gpu.instances[gi_id]
            instances.append(
                {
                    "id": gi.id,
                    "profile_id": gi.profile.profile_id,
                    "start": gi.start,
                    "serial": gi.serial,
                    "activity": gi.activity,
                    "used_bytes": sum(p["used_bytes"] for p in procs if p["gi"] == gi.id),
                    "reserved_bytes": reserved_mib(gpu.product, gi.profile) * MIB,
                    "cis": [
                        {"id": ci.id, "slices": ci.slices, "start": ci.start, "uuid": ci.uuid}
                        for _, ci in sorted(gi.compute_instances.items())
                    ],
                }
            )
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "serial": gpu.serial,
                "product": gpu.product.key,
                "pci_bus_id": gpu.pci_bus_id,
                "lost": gpu.lost,
                "nvlink_down": gpu.nvlink_down,
                "mig": [gpu.mig_current, gpu.mig_pending],
                "activity": gpu.activity,
                "power_mw": int(gpu.power_w * 1000),
                "energy_mj": int(gpu.energy_mj),
                "temperature": gpu.temperature_c,
                "used_bytes": sum(p["used_bytes"] for p in procs),
                "reserved_bytes": gpu_reserved_mib(gpu) * MIB,
                "ecc": [
                    gpu.ecc_corrected_volatile,
                    gpu.ecc_uncorrected_volatile,
                    gpu.ecc_corrected_aggregate,
                    gpu.ecc_uncorrected_aggregate,
                ],
                "remapped_rows": [
                    gpu.remapped_correctable,
                    gpu.remapped_uncorrectable,
                    int(gpu.remap_pending),
                    int(gpu.remap_failure),
                ],
                "clocks_event_reasons": gpu.clocks_event_reasons,
                "processes": [
                    {
                        "pid": p["pid"],
                        "used_bytes": p["used_bytes"],
                        "gi": p["gi"],
                        "pod_uid": p["pod_uid"],
                        "sm_util": p.get("sm_util", 0),
                    }
                    for p in procs
                ],
                "instances": instances,
                # A vm-vgpu node: the vGPUs VMs hold on this GPU (simcluster.vgpudm), as the vGPU manager counts them.
                "vgpus": [
                    {
                        "mdev": p["device"],
                        "type": vgpu_type,
                        "sm_util": p["sm_util"],
                        "fb_used_bytes": _vgpu_fb_used(p["used_bytes"], gpu.product.memory_mib, vgpu_type),
                        "vm": p["pod"],
                    }
                    for p in procs
                    if vgpudm.VGPU_DEVICE_MARK in p["device"]
                ],
            }
        )
    settings = cluster.settings
    return {
        "cluster": cluster.name,
        "node": node.name,
        "driver_version": settings.driver_version,
        "nvml_version": "12." + settings.driver_version,
        "cuda_driver_version": _cuda_int(settings.cuda_version),
        "time": cluster.state.sim_time,
        "event_seq": node.event_seq,
        "gpus": gpus,
    }


def _node(state: SimState, cluster_name: str | None, node_name: str) -> tuple[Cluster, Node]:
    cluster = state.cluster(cluster_name)
    node = cluster.nodes.get(node_name)
    if node is None:
        raise NodeGone(f"node {node_name!r} not found in cluster {cluster.name!r}")
    return cluster, node


def snapshot(state: SimState, cluster_name: str | None, node_name: str) -> dict:
    with state.lock:
        cluster, node = _node(state, cluster_name, node_name)
        return node_snapshot(cluster, node)


MAX_HISTORY_POINTS = 20_000


def history(state: SimState, cluster_name: str | None, node_name: str, seconds: float, step: float) -> dict:
    """The node's activity over the last `seconds` of simulated time, every `step`, ending one step
    before now, from the same model that ticks (work placed as it is now). Changes nothing.

    {"time": sim time now, "step": step, "units": [{"gpu": GPU uuid, "uuid": GPU or MIG device uuid,
    "mig": bool, "sm_active": [percent, oldest first], "mem_used_mib": [MiB], and for whole GPUs "power_w": [W],
    "temp_c": [C], "gpu_util": [percent] (None on a MIG-enabled GPU, as NVML answers NotSupported)}]}: each
    the value a live poll reads through the fake NVML at that time (memory as placed now, processes plus
    the driver's reservation).
    """
    if step <= 0 or seconds < step:
        raise ValueError("need 0 < step <= seconds")
    points = int(seconds // step)
    if points > MAX_HISTORY_POINTS:
        raise ValueError(f"at most {MAX_HISTORY_POINTS} points")
    with state.lock:
        cluster, node = _node(state, cluster_name, node_name)
        work = scheduler.unit_work(cluster, node)
        memory = unit_memory_mib(cluster, node)
        now = state.sim_time
        units = []
        for gpu in node.gpus:
            if gpu.lost:
                continue
            on_gpu = work.get(gpu.index, {})
            sm, power, temp, util, by_gi = [], [], [], [], {gi_id: [] for gi_id in gpu.instances}
            for k in range(points, 0, -1):
                activity, instances, watts = gpu.levels(now - k * step, on_gpu)
                sm.append(round(100.0 * activity, 3))
                power.append(round(watts, 3))
                temp.append(gpu.temperature_at(activity))
                util.append(None if gpu.mig_enabled else int(round(activity * 100)))
                for gi_id, value in instances.items():
                    by_gi[gi_id].append(round(100.0 * value, 3))
            units.append(
                {
                    "gpu": gpu.uuid,
                    "uuid": gpu.uuid,
                    "mig": False,
                    "sm_active": sm,
                    "mem_used_mib": [memory[(gpu.index, None)]] * points,
                    "power_w": power,
                    "temp_c": temp,
                    "gpu_util": util,
                }
            )
            for gi_id, values in by_gi.items():
                ci = gpu.instances[gi_id].full_ci()
                if ci is not None:
                    mem = [memory[(gpu.index, gi_id)]] * points
                    units.append(
                        {"gpu": gpu.uuid, "uuid": ci.uuid, "mig": True, "sm_active": values, "mem_used_mib": mem}
                    )
        return {"time": now, "step": step, "units": units}


def _gpu_in_use(node: Node, gpu: Gpu, gi: GpuInstance | None = None, ci_id: int | None = None) -> bool:
    """Does a pod hold a device on this GPU (or on this GI, or this CI)?"""
    held = {device_id.split("::")[0] for device_id in node.assigned}
    if gi is None:
        return gpu.uuid in held or any(ci.uuid in held for _, ci in gpu.mig_devices())
    return any(ci.uuid in held for ci in gi.compute_instances.values() if ci_id is None or ci.id == ci_id)


def _gi(gpu: Gpu, args: dict) -> GpuInstance:
    gi = gpu.instances.get(int(args["gi"]))
    if gi is None or ("serial" in args and gi.serial != int(args["serial"])):
        raise HardwareError(NVML_ERROR_INVALID_ARGUMENT, "stale or unknown GPU instance handle")
    return gi


def nvml_op(state: SimState, cluster_name: str | None, node_name: str, op: str, args: dict) -> dict:
    """One MIG write; {"ret": NVML code, ...result, "snapshot": node snapshot after it}."""
    with state.lock:
        cluster, node = _node(state, cluster_name, node_name)
        result: dict = {}
        try:
            gpu = node.gpu(int(args["gpu"]))
        except (KeyError, ValueError):
            return {"ret": NVML_ERROR_INVALID_ARGUMENT, "snapshot": node_snapshot(cluster, node)}
        try:
            if gpu.lost:
                raise HardwareError(NVML_ERROR_GPU_IS_LOST)
            if op == "set_mig_mode":
                result["activation"] = gpu.set_mig_mode(int(args["mode"]), in_use=_gpu_in_use(node, gpu))
            elif op == "create_gi":
                gi = gpu.create_gpu_instance(gpu.profile_by_id(int(args["profile_id"])), args.get("start"))
                result.update(gi=gi.id, serial=gi.serial)
            elif op == "destroy_gi":
                gi = _gi(gpu, args)
                if _gpu_in_use(node, gpu, gi):
                    raise HardwareError(NVML_ERROR_IN_USE, "processes are running on the GPU instance")
                gpu.destroy_gpu_instance(gi.id)
            elif op == "create_ci":
                gi = _gi(gpu, args)
                ci = gpu.create_compute_instance(gi, int(args["slices"]), args.get("start"))
                result["ci"] = ci.id
            elif op == "destroy_ci":
                gi = _gi(gpu, args)
                ci_id = int(args["ci"])
                if _gpu_in_use(node, gpu, gi, ci_id):
                    raise HardwareError(NVML_ERROR_IN_USE, "processes are running on the compute instance")
                gpu.destroy_compute_instance(gi, ci_id)
            else:
                raise HardwareError(NVML_ERROR_INVALID_ARGUMENT, f"unknown op {op!r}")
            result["ret"] = NVML_SUCCESS
            if state.device_plugin_restart:
                gpuoperator.relabel(cluster, node)  # the plugin keeps its devices until its pod restarts
            else:
                gpuoperator.refresh_node(cluster, node)
        except HardwareError as exc:
            result = {"ret": exc.code, "message": str(exc)}
        result["snapshot"] = node_snapshot(cluster, node)
        return result


def wait_events(
    state: SimState, cluster_name: str | None, node_name: str, after: int, masks: dict[int, int], timeout_s: float
) -> list[dict]:
    """Events newer than `after` for the registered GPUs/types, waiting up to timeout_s."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    with state.lock:
        while True:
            _, node = _node(state, cluster_name, node_name)
            found = [e for e in node.events if e["seq"] > after and masks.get(e["gpu"], 0) & e["type"]]
            if found:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            state.events_changed.wait(remaining)
