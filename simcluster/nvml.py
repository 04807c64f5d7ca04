"""Fake NVML: pynvml's own Python code running over a simulated libnvidia-ml.

`library_for_node(api_url, node_name)` returns a module-like object with exactly the
functions, constants, ctypes structs and exception classes of `pynvml`, bound to one
simulated node. Adapter code written for real pynvml runs unchanged against it.

How: every function of the installed `pynvml` module is re-created (same code object,
defaults and decorators) with its globals pointed at a private copy of pynvml's
namespace, in which `_LoadNvmlLibrary` installs `SimulatedLibrary` instead of loading
libnvidia-ml.so.1. So the wrappers allocate the same ctypes structs, convert bytes/str the
same way (PciInfo.busId stays bytes, names come back as str), run the same two-call
protocols (running processes, retired pages) and raise pynvml's own `NVMLError_*`
classes; only the C entry points are simulated. A C symbol the simulation lacks raises
`NVMLError_FunctionNotFound`, exactly as an older driver would. Calling anything before
`nvmlInit()` raises `NVMLError_Uninitialized` (the library is not "loaded" yet).

The simulated C functions read a snapshot of the node (simcluster.driver.node_snapshot):
fetched at `nvmlInit`, refreshed when older than `max_age` seconds and replaced by the
server's answer after every write (MIG mode, GPU/compute instance create/destroy), so a
polling task costs one round trip per node: a drain of the XID event set (nvmlEventSetWait with
timeout 0) is answered from that snapshot when it shows no event newer than the set has seen (the
snapshot carries the node's event sequence), and asks the server only when there is one. In
another process (the Celery worker) the transport is HTTP to `<api_url>/sim/v1/nodes/<node>/nvml`;
when the SimServer runs in the same process the state is read directly (`max_age` 0: always fresh).

Behaviour notes (reference §7): utilisation rates are NotSupported on MIG-enabled GPUs;
retired pages are NotSupported (row remapping replaced them on A100/H100/H200); GPM is
supported on Hopper (per device, and per GPU instance via nvmlGpmMigSampleGet) and
answers isSupportedDevice=0 / NotSupported on Ampere; a lost GPU answers GPU_IS_LOST to
every call, including handle lookups by index/UUID; MIG-device handles support identity,
memory, attributes, processes and GI/CI ids, and answer NotSupported to power,
temperature, ECC, clocks and utilisation queries. Clocks (MHz), performance state, power limits
and constraints (mW), BAR1 memory (bytes) and field values (nvmlDeviceGetFieldValues, for the
counters gpuaas records) answer in the real units; their per-board figures are simulator values.

Privilege (docs/simcluster.md "NVML permissions"): a library built with `privileged=False` is an
unprivileged node agent: the calls nvml.h marks "Requires privileged user" (GPU/compute instance
queries, creation and destruction, MIG mode changes) answer NVML_ERROR_NO_PERMISSION, as the real
driver does for a process without root or the MIG capabilities. The default is privileged.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import threading
import time
import types
from urllib.parse import quote, urlsplit

import pynvml

from capacity.mig.catalog import CI_PROFILE_BY_SLICES, get_product

from . import driver, topology
from .hardware import ci_starts, remaining_capacity
from .nvml_abi import (
    PRIVILEGED_SYMBOLS,  # noqa: F401 (the unprivileged agent tests read it here)
    TransportError,
    _address,
    _bytes_in,
    _c_call,
    _int,
    _out_array,
    _Return,
    _set,
    _store_pointer,
    _target,
    _write_string,
)
from .nvml_vgpu import VgpuCalls

_UNAVAILABLE = 0xFFFFFFFF
EVENT_SNAPSHOT_S = 1.0  # how old a snapshot may be to answer "no new events" without a round trip
_SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypeSingleBitEccError
)
_CI_SLICES_BY_PROFILE = {v: k for k, v in CI_PROFILE_BY_SLICES.items()}
_ERROR_STRINGS = {
    **pynvml.NVMLError._errcode_to_string,
    pynvml.NVML_ERROR_IN_USE: "In use by another client",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
    pynvml.NVML_ERROR_NO_DATA: "No data",
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
}


class Board:
    """Per-board figures NVML reports beyond the MIG catalog: max clocks (MHz), BAR1 (MiB), minimum power limit (W).

    H100 80GB HBM3, H100 NVL and H200 are the values real boards printed in `nvidia-smi -q` ("Max Clocks",
    "BAR1 Memory Usage", "Min Power Limit"; tests/fixtures/nvml/, sources in its README). The other boards'
    figures are simulator values of the same order, not sourced figure by figure; nothing in the product
    depends on them.
    """

    def __init__(self, sm_mhz: int, mem_mhz: int, bar1_mib: int, min_power_w: int, video_mhz: int = 1410):
        self.sm_mhz, self.mem_mhz, self.bar1_mib, self.min_power_w = sm_mhz, mem_mhz, bar1_mib, min_power_w
        self.video_mhz = video_mhz


BOARDS = {
    "A100-40GB": Board(1410, 1215, 65536, 100),
    "A100-80GB": Board(1410, 1593, 131072, 100),
    "A100-40GB-PCIE": Board(1410, 1215, 65536, 150),
    "A100-80GB-PCIE": Board(1410, 1512, 131072, 150),
    "A30-24GB": Board(1440, 1215, 32768, 100),
    "H100-80GB": Board(1980, 2619, 131072, 200, video_mhz=1545),  # recorded
    "H100-80GB-PCIE": Board(1755, 1593, 131072, 200),
    "H100-94GB-NVL": Board(1785, 2619, 131072, 200, video_mhz=1410),  # recorded
    "H200-141GB": Board(1980, 3201, 262144, 200, video_mhz=1545),  # recorded
    "H200-141GB-NVL": Board(1785, 3201, 262144, 200),
}
_DEFAULT_BOARD = Board(1410, 1215, 65536, 100)
_IDLE_SM_MHZ = 345  # idle Hopper SM/graphics clock, as the recorded H100/H200 `nvidia-smi -q` show it
_IDLE_VIDEO_MHZ = 765  # idle video clock, same captures
_IDLE_ACTIVITY = 0.05  # below this the GPU runs nothing (the load model's idle band is 0.2-2 %) and clocks down
# NVML field ids gpuaas records (power, energy, temperature, ECC, row remapping) -> (value type, reader).
_ULL, _UI = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_FIELDS = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (_ULL, lambda g: g["ecc"][0]),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (_ULL, lambda g: g["ecc"][1]),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (_ULL, lambda g: g["ecc"][2]),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (_ULL, lambda g: g["ecc"][3]),
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (_ULL, lambda g: g["energy_mj"]),  # mJ
    pynvml.NVML_FI_DEV_POWER_INSTANT: (_UI, lambda g: g["power_mw"]),  # mW
    pynvml.NVML_FI_DEV_POWER_AVERAGE: (_UI, lambda g: g["power_mw"]),  # mW
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: (_UI, lambda g: g["product_obj"].power_limit_w * 1000),  # mW
    pynvml.NVML_FI_DEV_REMAPPED_COR: (_UI, lambda g: g["remapped_rows"][0]),
    pynvml.NVML_FI_DEV_REMAPPED_UNC: (_UI, lambda g: g["remapped_rows"][1]),
}

# GPM metric id -> share of SM activity it reports (0..1 scale before *100).
_GPM_SHARES = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 1.0,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 0.55,
    pynvml.NVML_GPM_METRIC_INTEGER_UTIL: 0.1,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.45,
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.02,
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 0.4,
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0.03,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.5,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.02,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 0.25,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.2,
}


# ----------------------------------------------------------------------------------------
# Transports


class LocalBackend:
    """Reads the SimState of this process directly."""

    def __init__(self, state, cluster: str | None, node: str):
        self.state, self.cluster, self.node = state, cluster, node

    def snapshot(self) -> dict:
        return driver.snapshot(self.state, self.cluster, self.node)

    def op(self, op: str, **args) -> dict:
        return driver.nvml_op(self.state, self.cluster, self.node, op, args)

    def events(self, after: int, masks: dict[int, int], timeout_s: float) -> list[dict]:
        return driver.wait_events(self.state, self.cluster, self.node, after, masks, timeout_s)


class HttpBackend:
    """Talks to a SimServer over HTTP (one persistent connection, reopened on failure)."""

    def __init__(self, api_url: str, node: str, *, token: str | None = None, timeout: float = 10.0):
        parts = urlsplit(api_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._path = parts.path.rstrip("/") + f"/sim/v1/nodes/{quote(node, safe='')}/nvml"
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        token = token or os.environ.get("SIMCLUSTER_TOKEN")
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self.requests = 0  # round trips made (tests check that sessions stay cheap)

    def _request(self, method: str, payload: dict | None, timeout: float) -> dict:
        body = json.dumps(payload).encode() if payload is not None else None
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None:
                        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                        self._conn = cls(self._host, self._port, timeout=timeout)
                    self._conn.timeout = timeout
                    if self._conn.sock is not None:
                        self._conn.sock.settimeout(timeout)
                    self.requests += 1
                    self._conn.request(method, self._path, body=body, headers=self._headers)
                    response = self._conn.getresponse()
                    data = response.read()
                except (OSError, http.client.HTTPException) as exc:
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise TransportError(f"simulator unreachable: {exc}") from exc
                    continue
                if response.status == 404:
                    raise driver.NodeGone(data.decode(errors="replace"))
                if response.status != 200:
                    raise TransportError(f"simulator answered {response.status}: {data[:200]!r}")
                return json.loads(data)
        raise TransportError("unreachable")  # pragma: no cover

    def snapshot(self) -> dict:
        return self._request("GET", None, self._timeout)

    def op(self, op: str, **args) -> dict:
        return self._request("POST", {"op": op, "args": args}, self._timeout)

    def events(self, after: int, masks: dict[int, int], timeout_s: float) -> list[dict]:
        answer = self._request(
            "POST",
            {
                "op": "events",
                "args": {"after": after, "masks": {str(k): v for k, v in masks.items()}, "timeout_s": timeout_s},
            },
            self._timeout + timeout_s,
        )
        return answer["events"]


# ----------------------------------------------------------------------------------------
# ctypes plumbing


def _write_pci(info, bus_id: str, device_id: int | None = None) -> None:
    """Fill an nvmlPciInfo_t for `bus_id` ("00000000:18:00.0"); an NVIDIA device id when given (GPUs)."""
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id[4:].encode()
    info.domain = int(bus_id.split(":")[0], 16)
    info.bus = int(bus_id.split(":")[1], 16)
    info.device = int(bus_id.split(":")[2].split(".")[0], 16)
    if device_id is not None:
        info.pciDeviceId = (device_id << 16) | 0x10DE
        info.pciSubSystemId = (0x1839 << 16) | 0x10DE


def _snapshot_view(snap: dict) -> dict:
    """Index a node snapshot for lookups by index, UUID, bus id and MIG UUID."""
    view = {"snap": snap, "gpus": {}, "by_uuid": {}, "by_bus": {}, "mig_by_uuid": {}}
    for gpu in snap["gpus"]:
        gpu["product_obj"] = get_product(gpu["product"])
        view["gpus"][gpu["index"]] = gpu
        view["by_uuid"][gpu["uuid"]] = gpu
        view["by_bus"][gpu["pci_bus_id"].lower()] = gpu
        view["by_bus"][gpu["pci_bus_id"][4:].lower()] = gpu
        gpu["gis"] = {gi["id"]: gi for gi in gpu["instances"]}
        migs = []
        for gi in gpu["instances"]:
            for ci in gi["cis"]:
                migs.append((gi, ci))
                view["mig_by_uuid"][ci["uuid"]] = (gpu, gi, ci)
        gpu["migs"] = migs
    return view


# ----------------------------------------------------------------------------------------
# The simulated C library


class SimulatedLibrary(VgpuCalls):
    """The C entry points of libnvidia-ml that pynvml calls, answered from a node snapshot."""

    def __init__(self, backend, *, max_age: float, privileged: bool = True):
        self._backend = backend
        self._max_age = max_age
        self._privileged = privileged
        self._init_count = 0
        self._view: dict | None = None
        self._fetched = 0.0
        self._lock = threading.RLock()
        self._handles: dict[int, tuple] = {}
        self._addresses: dict[tuple, int] = {}
        self._buffers: list = []
        self._serial = 0
        self._gpm: dict[int, dict] = {}
        self._event_sets: dict[int, dict] = {}

    @classmethod
    def symbols(cls) -> set[str]:
        return {name for name in dir(cls) if getattr(getattr(cls, name), "c_symbol", False)}

    # --- snapshot and handles -----------------------------------------------------------

    def _refresh(self) -> dict:
        self._view = _snapshot_view(self._backend.snapshot())
        self._fetched = time.monotonic()
        return self._view

    def _current(self) -> dict:
        if self._view is None or time.monotonic() - self._fetched > self._max_age:
            return self._refresh()
        return self._view

    def _write(self, op: str, **args) -> dict:
        answer = self._backend.op(op, **args)
        self._view = _snapshot_view(answer["snapshot"])
        self._fetched = time.monotonic()
        if answer["ret"] != pynvml.NVML_SUCCESS:
            raise _Return(answer["ret"])
        return answer

    def _address_of(self, desc: tuple) -> int:
        address = self._addresses.get(desc)
        if address is None:
            buf = ctypes.create_string_buffer(8)  # a real allocation: handles stay unique and dereferenceable
            self._buffers.append(buf)
            address = ctypes.addressof(buf)
            self._addresses[desc] = address
            self._handles[address] = desc
        return address

    def _pointer(self, desc: tuple, ptype):
        return ctypes.cast(ctypes.c_void_p(self._address_of(desc)), ptype)

    def _desc(self, handle) -> tuple:
        desc = self._handles.get(_address(handle))
        if desc is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return desc

    def _gpu(self, index: int) -> dict:
        gpu = self._current()["gpus"].get(index)
        if gpu is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu["lost"]:
            raise _Return(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _device(self, handle) -> tuple[dict, dict | None, dict | None]:
        """(gpu, gi, ci) for a GPU handle (gi=ci=None) or a MIG device handle."""
        desc = self._desc(handle)
        if desc[0] == "gpu":
            return self._gpu(desc[1]), None, None
        if desc[0] == "mig":
            _, index, gi_id, serial, ci_id = desc
            gpu = self._gpu(index)
            gi = gpu["gis"].get(gi_id)
            ci = next((c for c in gi["cis"] if c["id"] == ci_id), None) if gi and gi["serial"] == serial else None
            if ci is None:
                raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return gpu, gi, ci
        raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _full_gpu(self, handle) -> dict:
        gpu, gi, _ = self._device(handle)
        if gi is not None:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _gi(self, handle) -> tuple[dict, dict]:
        desc = self._desc(handle)
        if desc[0] != "gi":
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpu(desc[1])
        gi = gpu["gis"].get(desc[2])
        if gi is None or gi["serial"] != desc[3]:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gi

    def _ci(self, handle) -> tuple[dict, dict, dict]:
        desc = self._desc(handle)
        if desc[0] != "ci":
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpu(desc[1])
        gi = gpu["gis"].get(desc[2])
        ci = next((c for c in gi["cis"] if c["id"] == desc[4]), None) if gi and gi["serial"] == desc[3] else None
        if ci is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gi, ci

    def pod_uid_for_pid(self, pid: int) -> str | None:
        """The pod a process belongs to: the simulator's stand-in for /proc/<pid>/cgroup."""
        with self._lock:
            view = self._view if self._init_count > 0 else None
            try:
                view = view or self._refresh()
            except (TransportError, driver.NodeGone):
                return None
            for gpu in view["gpus"].values():
                for proc in gpu["processes"]:
                    if proc["pid"] == int(pid):
                        return proc.get("pod_uid")
        return None

    @staticmethod
    def _profile(gpu: dict, gi: dict):
        return gpu["product_obj"].by_id[gi["profile_id"]]

    def _mig_desc(self, gpu: dict, gi: dict, ci: dict) -> tuple:
        return ("mig", gpu["index"], gi["id"], gi["serial"], ci["id"])

    # --- init / system ------------------------------------------------------------------

    @_c_call
    def nvmlInitWithFlags(self, flags):
        try:
            self._refresh()
        except (TransportError, driver.NodeGone):
            raise _Return(pynvml.NVML_ERROR_DRIVER_NOT_LOADED) from None
        self._init_count += 1

    @_c_call
    def nvmlShutdown(self):
        self._init_count -= 1
        if self._init_count == 0:
            self._view = None

    def nvmlErrorString(self, result):
        return _ERROR_STRINGS.get(_int(result), f"Unknown Error ({_int(result)})").encode()

    nvmlErrorString.c_symbol = True

    @_c_call
    def nvmlSystemGetDriverVersion(self, buf, size):
        _write_string(buf, size, self._current()["snap"]["driver_version"])

    @_c_call
    def nvmlSystemGetNVMLVersion(self, buf, size):
        _write_string(buf, size, self._current()["snap"]["nvml_version"])

    @_c_call
    def nvmlSystemGetCudaDriverVersion(self, ref):
        _set(ref, self._current()["snap"]["cuda_driver_version"])

    @_c_call
    def nvmlSystemGetCudaDriverVersion_v2(self, ref):
        _set(ref, self._current()["snap"]["cuda_driver_version"])

    @_c_call
    def nvmlDeviceGetCount_v2(self, ref):
        _set(ref, len(self._current()["gpus"]))

    # --- handles ------------------------------------------------------------------------

    @_c_call
    def nvmlDeviceGetHandleByIndex_v2(self, index, ref):
        gpu = self._gpu(_int(index))
        _store_pointer(ref, self._address_of(("gpu", gpu["index"])))

    @_c_call
    def nvmlDeviceGetHandleByUUID(self, uuid, ref):
        text = _bytes_in(uuid).decode()
        view = self._current()
        gpu = view["by_uuid"].get(text)
        if gpu is not None:
            self._gpu(gpu["index"])
            _store_pointer(ref, self._address_of(("gpu", gpu["index"])))
            return
        found = view["mig_by_uuid"].get(text)
        if found is None:
            raise _Return(pynvml.NVML_ERROR_NOT_FOUND)
        self._gpu(found[0]["index"])
        _store_pointer(ref, self._address_of(self._mig_desc(*found)))

    @_c_call
    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id, ref):
        gpu = self._current()["by_bus"].get(_bytes_in(bus_id).decode().lower())
        if gpu is None:
            raise _Return(pynvml.NVML_ERROR_NOT_FOUND)
        self._gpu(gpu["index"])
        _store_pointer(ref, self._address_of(("gpu", gpu["index"])))

    # --- identity -----------------------------------------------------------------------

    @_c_call
    def nvmlDeviceGetName(self, handle, buf, size):
        gpu, gi, ci = self._device(handle)
        name = gpu["product_obj"].model_name
        if gi is not None:
            profile = self._profile(gpu, gi)
            prefix = "" if ci["slices"] == profile.compute_slices else f"{ci['slices']}c."
            name = f"{name} MIG {prefix}{profile.name}"
        _write_string(buf, size, name)

    @_c_call
    def nvmlDeviceGetUUID(self, handle, buf, size):
        gpu, gi, ci = self._device(handle)
        _write_string(buf, size, ci["uuid"] if ci else gpu["uuid"])

    @_c_call
    def nvmlDeviceGetSerial(self, handle, buf, size):
        _write_string(buf, size, self._full_gpu(handle)["serial"])

    @_c_call
    def nvmlDeviceGetPciInfo_v3(self, handle, ref):
        gpu, _, _ = self._device(handle)
        _write_pci(_target(ref), gpu["pci_bus_id"], gpu["product_obj"].pci_device_id)

    @_c_call
    def nvmlDeviceGetIndex(self, handle, ref):
        _set(ref, self._full_gpu(handle)["index"])

    @_c_call
    def nvmlDeviceGetMinorNumber(self, handle, ref):
        _set(ref, self._full_gpu(handle)["index"])

    @_c_call
    def nvmlDeviceGetArchitecture(self, handle, ref):
        gpu, _, _ = self._device(handle)
        _set(ref, gpu["product_obj"].architecture)

    @_c_call
    def nvmlDeviceGetCudaComputeCapability(self, handle, major, minor):
        gpu, _, _ = self._device(handle)
        _set(major, gpu["product_obj"].compute_major)
        _set(minor, gpu["product_obj"].compute_minor)

    @_c_call
    def nvmlDeviceGetPersistenceMode(self, handle, ref):
        self._full_gpu(handle)
        _set(ref, pynvml.NVML_FEATURE_ENABLED)

    # --- memory ---------------------------------------------------------------------------

    def _memory(self, handle) -> tuple[int, int, int]:
        gpu, gi, _ = self._device(handle)
        mib = 1024 * 1024
        if gi is not None:
            return self._profile(gpu, gi).memory_mib * mib, gi["reserved_bytes"], gi["used_bytes"]
        return gpu["product_obj"].memory_mib * mib, gpu["reserved_bytes"], gpu["used_bytes"]

    @_c_call
    def nvmlDeviceGetMemoryInfo(self, handle, ref):
        total, reserved, used = self._memory(handle)
        info = _target(ref)
        info.total, info.used, info.free = total, used + reserved, total - used - reserved

    @_c_call
    def nvmlDeviceGetMemoryInfo_v2(self, handle, ref):
        info = _target(ref)
        if info.version != pynvml.nvmlMemory_v2:
            raise _Return(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        total, reserved, used = self._memory(handle)
        info.total, info.reserved, info.used, info.free = total, reserved, used, total - used - reserved

    # --- MIG mode and GPU instances -----------------------------------------------------

    @_c_call
    def nvmlDeviceGetMigMode(self, handle, current, pending):
        gpu = self._full_gpu(handle)
        _set(current, gpu["mig"][0])
        _set(pending, gpu["mig"][1])

    @_c_call
    def nvmlDeviceSetMigMode(self, handle, mode, activation):
        gpu = self._full_gpu(handle)
        answer = self._write("set_mig_mode", gpu=gpu["index"], mode=_int(mode))
        _set(activation, answer["activation"])

    def _profile_by_index(self, gpu: dict, index: int):
        if not gpu["mig"][0]:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = next((p for p in gpu["product_obj"].profiles if p.nvml_index == index), None)
        if profile is None:
            raise _Return(
                pynvml.NVML_ERROR_NOT_SUPPORTED
                if 0 <= index < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
                else pynvml.NVML_ERROR_INVALID_ARGUMENT
            )
        return profile

    def _fill_gi_profile(self, gpu: dict, index, ref, with_name: bool) -> None:
        profile = self._profile_by_index(gpu, _int(index))
        info = _target(ref)
        info.id = profile.profile_id
        info.isP2pSupported = 0
        info.sliceCount = profile.compute_slices
        info.instanceCount = profile.max_instances
        info.multiprocessorCount = profile.multiprocessors
        info.copyEngineCount = profile.copy_engines
        info.decoderCount = profile.decoders
        info.encoderCount = profile.encoders
        info.jpegCount = profile.jpegs
        info.ofaCount = profile.ofas
        info.memorySizeMB = profile.memory_mib
        if with_name:
            info.name = f"MIG {profile.name}".encode()

    @_c_call
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, index, ref):
        self._fill_gi_profile(self._full_gpu(handle), index, ref, with_name=False)

    @_c_call
    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle, index, ref):
        self._fill_gi_profile(self._full_gpu(handle), index, ref, with_name=True)

    def _profile_by_id(self, gpu: dict, profile_id):
        profile = gpu["product_obj"].by_id.get(_int(profile_id))
        if profile is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    @_c_call
    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(self, handle, profile_id, placements, count):
        gpu = self._full_gpu(handle)
        profile = self._profile_by_id(gpu, profile_id)
        if placements is not None:
            out = _out_array(placements, len(profile.placements))
            for i, (start, size) in enumerate(profile.placements):
                out[i].start, out[i].size = start, size
        _set(count, len(profile.placements))

    @_c_call
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle, profile_id, ref):
        gpu = self._full_gpu(handle)
        profile = self._profile_by_id(gpu, profile_id)
        if not gpu["mig"][0]:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        product = gpu["product_obj"]
        existing = [(product.by_id[gi["profile_id"]], gi["start"]) for gi in gpu["instances"]]
        _set(ref, remaining_capacity(product, profile, existing))

    def _create_gi(self, gpu: dict, profile_id, start, ref) -> None:
        profile = self._profile_by_id(gpu, profile_id)
        answer = self._write("create_gi", gpu=gpu["index"], profile_id=profile.profile_id, start=start)
        _store_pointer(ref, self._address_of(("gi", gpu["index"], answer["gi"], answer["serial"])))

    @_c_call
    def nvmlDeviceCreateGpuInstance(self, handle, profile_id, ref):
        self._create_gi(self._full_gpu(handle), profile_id, None, ref)

    @_c_call
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle, profile_id, placement, ref):
        gpu = self._full_gpu(handle)
        wanted = _target(placement)
        profile = self._profile_by_id(gpu, profile_id)
        if wanted.size != profile.memory_slices:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._create_gi(gpu, profile_id, int(wanted.start), ref)

    @_c_call
    def nvmlDeviceGetGpuInstances(self, handle, profile_id, instances, count):
        gpu = self._full_gpu(handle)
        profile = self._profile_by_id(gpu, profile_id)
        if not gpu["mig"][0]:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        found = [gi for gi in gpu["instances"] if gi["profile_id"] == profile.profile_id]
        if found:
            out = _out_array(instances, len(found))
            for i, gi in enumerate(found):
                out[i] = self._pointer(("gi", gpu["index"], gi["id"], gi["serial"]), pynvml.c_nvmlGpuInstance_t)
        _set(count, len(found))

    @_c_call
    def nvmlDeviceGetGpuInstanceById(self, handle, gi_id, ref):
        gpu = self._full_gpu(handle)
        if not gpu["mig"][0]:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gi = gpu["gis"].get(_int(gi_id))
        if gi is None:
            raise _Return(pynvml.NVML_ERROR_NOT_FOUND)
        _store_pointer(ref, self._address_of(("gi", gpu["index"], gi["id"], gi["serial"])))

    @_c_call
    def nvmlGpuInstanceGetInfo(self, handle, ref):
        gpu, gi = self._gi(handle)
        info = _target(ref)
        info.device = self._pointer(("gpu", gpu["index"]), pynvml.c_nvmlDevice_t)
        info.id = gi["id"]
        info.profileId = gi["profile_id"]
        info.placement.start = gi["start"]
        info.placement.size = self._profile(gpu, gi).memory_slices

    @_c_call
    def nvmlGpuInstanceDestroy(self, handle):
        gpu, gi = self._gi(handle)
        self._write("destroy_gi", gpu=gpu["index"], gi=gi["id"], serial=gi["serial"])

    # --- compute instances --------------------------------------------------------------

    def _ci_slices(self, gpu: dict, gi: dict, profile_id) -> int:
        slices = _CI_SLICES_BY_PROFILE.get(_int(profile_id))
        g = self._profile(gpu, gi).compute_slices
        if slices is None or slices > g or not ci_starts(g, slices):
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return slices

    def _fill_ci_profile(self, handle, profile_index, eng_profile, ref, with_name: bool) -> None:
        gpu, gi = self._gi(handle)
        if _int(eng_profile) != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slices = self._ci_slices(gpu, gi, profile_index)
        profile = self._profile(gpu, gi)
        info = _target(ref)
        info.id = _int(profile_index)
        info.sliceCount = slices
        info.instanceCount = len(ci_starts(profile.compute_slices, slices))
        info.multiprocessorCount = profile.multiprocessors * slices // profile.compute_slices
        info.sharedCopyEngineCount = profile.copy_engines
        info.sharedDecoderCount = profile.decoders
        info.sharedEncoderCount = profile.encoders
        info.sharedJpegCount = profile.jpegs
        info.sharedOfaCount = profile.ofas
        if with_name:
            prefix = "" if slices == profile.compute_slices else f"{slices}c."
            info.name = f"MIG {prefix}{profile.name}".encode()

    @_c_call
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, handle, profile, eng_profile, ref):
        self._fill_ci_profile(handle, profile, eng_profile, ref, with_name=False)

    @_c_call
    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, handle, profile, eng_profile, ref):
        self._fill_ci_profile(handle, profile, eng_profile, ref, with_name=True)

    @_c_call
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(self, handle, profile_id, ref):
        gpu, gi = self._gi(handle)
        slices = self._ci_slices(gpu, gi, profile_id)
        g = self._profile(gpu, gi).compute_slices
        used = sum(c["slices"] for c in gi["cis"])
        free = [
            s
            for s in ci_starts(g, slices)
            if all(s + slices <= c["start"] or s >= c["start"] + c["slices"] for c in gi["cis"])
        ]
        _set(ref, min(len(free), (g - used) // slices))

    def _create_ci(self, handle, profile_id, start, ref) -> None:
        gpu, gi = self._gi(handle)
        slices = self._ci_slices(gpu, gi, profile_id)
        answer = self._write(
            "create_ci", gpu=gpu["index"], gi=gi["id"], serial=gi["serial"], slices=slices, start=start
        )
        _store_pointer(ref, self._address_of(("ci", gpu["index"], gi["id"], gi["serial"], answer["ci"])))

    @_c_call
    def nvmlGpuInstanceCreateComputeInstance(self, handle, profile_id, ref):
        self._create_ci(handle, profile_id, None, ref)

    @_c_call
    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(self, handle, profile_id, placement, ref):
        self._create_ci(handle, profile_id, int(_target(placement).start), ref)

    @_c_call
    def nvmlGpuInstanceGetComputeInstances(self, handle, profile_id, instances, count):
        gpu, gi = self._gi(handle)
        slices = self._ci_slices(gpu, gi, profile_id)
        found = [c for c in gi["cis"] if c["slices"] == slices]
        if found:
            out = _out_array(instances, len(found))
            for i, ci in enumerate(found):
                out[i] = self._pointer(
                    ("ci", gpu["index"], gi["id"], gi["serial"], ci["id"]), pynvml.c_nvmlComputeInstance_t
                )
        _set(count, len(found))

    @_c_call
    def nvmlGpuInstanceGetComputeInstanceById(self, handle, ci_id, ref):
        gpu, gi = self._gi(handle)
        ci = next((c for c in gi["cis"] if c["id"] == _int(ci_id)), None)
        if ci is None:
            raise _Return(pynvml.NVML_ERROR_NOT_FOUND)
        _store_pointer(ref, self._address_of(("ci", gpu["index"], gi["id"], gi["serial"], ci["id"])))

    @_c_call
    def nvmlComputeInstanceGetInfo_v2(self, handle, ref):
        gpu, gi, ci = self._ci(handle)
        info = _target(ref)
        info.device = self._pointer(("gpu", gpu["index"]), pynvml.c_nvmlDevice_t)
        info.gpuInstance = self._pointer(("gi", gpu["index"], gi["id"], gi["serial"]), pynvml.c_nvmlGpuInstance_t)
        info.id = ci["id"]
        info.profileId = CI_PROFILE_BY_SLICES[ci["slices"]]
        info.placement.start = ci["start"]
        info.placement.size = ci["slices"]

    @_c_call
    def nvmlComputeInstanceDestroy(self, handle):
        gpu, gi, ci = self._ci(handle)
        self._write("destroy_ci", gpu=gpu["index"], gi=gi["id"], serial=gi["serial"], ci=ci["id"])

    # --- MIG devices --------------------------------------------------------------------

    @_c_call
    def nvmlDeviceGetMaxMigDeviceCount(self, handle, ref):
        gpu = self._full_gpu(handle)
        _set(ref, gpu["product_obj"].max_gpu_instances if gpu["mig"][0] else 0)

    @_c_call
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index, ref):
        gpu = self._full_gpu(handle)
        i = _int(index)
        if not gpu["mig"][0] or i >= gpu["product_obj"].max_gpu_instances:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if i >= len(gpu["migs"]):
            raise _Return(pynvml.NVML_ERROR_NOT_FOUND)
        gi, ci = gpu["migs"][i]
        _store_pointer(ref, self._address_of(self._mig_desc(gpu, gi, ci)))

    @_c_call
    def nvmlDeviceIsMigDeviceHandle(self, handle, ref):
        _, gi, _ = self._device(handle)
        _set(ref, 1 if gi is not None else 0)

    @_c_call
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle, ref):
        gpu, gi, _ = self._device(handle)
        if gi is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _store_pointer(ref, self._address_of(("gpu", gpu["index"])))

    @_c_call
    def nvmlDeviceGetGpuInstanceId(self, handle, ref):
        _, gi, _ = self._device(handle)
        if gi is None:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _set(ref, gi["id"])

    @_c_call
    def nvmlDeviceGetComputeInstanceId(self, handle, ref):
        _, gi, ci = self._device(handle)
        if gi is None:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _set(ref, ci["id"])

    # --- NVLink and PCIe topology ------------------------------------------------------------
    # Per product from simcluster.topology: link state, where each link ends (a peer GPU over an NVLink
    # bridge, or an NVSwitch), P2P over NVLink, and the PCIe common ancestor of two GPUs.

    def _link_end(self, handle, link) -> tuple[dict, tuple[str, int] | None]:
        """(gpu, where link `link` ends): NOT_SUPPORTED without NVLink, INVALID_ARGUMENT past its last link."""
        gpu = self._full_gpu(handle)
        board = topology.fabric(gpu["product"])
        if board is None:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= _int(link) < board.links:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, topology.nvlink_remote(gpu["product"], gpu["index"], _int(link), len(self._current()["gpus"]))

    @_c_call
    def nvmlDeviceGetNvLinkState(self, handle, link, ref):
        gpu, end = self._link_end(handle, link)
        # A bridge is down for both of its GPUs; an NVSwitch link only for the GPU whose links failed.
        peer = self._current()["gpus"].get(end[1]) if end and end[0] == "gpu" else None
        down = end is None or gpu.get("nvlink_down") or (peer is not None and peer.get("nvlink_down"))
        _set(ref, pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED)

    @_c_call
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link, ref):
        _, end = self._link_end(handle, link)
        if end is None:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        kind = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if end[0] == "switch" else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        _set(ref, kind)

    @_c_call
    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle, link, ref):
        _, end = self._link_end(handle, link)
        if end is None:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if end[0] == "switch":
            _write_pci(_target(ref), topology.nvswitch_bus_id(end[1]))
        else:
            peer = self._current()["gpus"][end[1]]
            _write_pci(_target(ref), peer["pci_bus_id"], peer["product_obj"].pci_device_id)

    @_c_call
    def nvmlDeviceGetP2PStatus(self, handle1, handle2, index, ref):
        a, b = self._full_gpu(handle1), self._full_gpu(handle2)
        if _int(index) != pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            _set(ref, pynvml.NVML_P2P_STATUS_UNKNOWN)
            return
        domain_a = topology.nvlink_domain(a["product"], a["index"])
        linked = (
            a["index"] != b["index"]
            and domain_a is not None
            and domain_a == topology.nvlink_domain(b["product"], b["index"])
            and not (a.get("nvlink_down") or b.get("nvlink_down"))
        )
        _set(ref, pynvml.NVML_P2P_STATUS_OK if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)

    @_c_call
    def nvmlDeviceGetTopologyCommonAncestor(self, handle1, handle2, ref):
        a, b = self._full_gpu(handle1), self._full_gpu(handle2)
        _set(ref, topology.common_ancestor(a["index"], b["index"], len(self._current()["gpus"])))

    @_c_call
    def nvmlDeviceGetAttributes_v2(self, handle, ref):
        gpu, gi, ci = self._device(handle)
        if gi is None:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile(gpu, gi)
        attrs = _target(ref)
        attrs.multiprocessorCount = profile.multiprocessors * ci["slices"] // profile.compute_slices
        attrs.sharedCopyEngineCount = profile.copy_engines
        attrs.sharedDecoderCount = profile.decoders
        attrs.sharedEncoderCount = profile.encoders
        attrs.sharedJpegCount = profile.jpegs
        attrs.sharedOfaCount = profile.ofas
        attrs.gpuInstanceSliceCount = profile.compute_slices
        attrs.computeInstanceSliceCount = ci["slices"]
        attrs.memorySizeMB = profile.memory_mib

    # --- telemetry ----------------------------------------------------------------------

    @_c_call
    def nvmlDeviceGetPowerUsage(self, handle, ref):
        _set(ref, self._full_gpu(handle)["power_mw"])

    @_c_call
    def nvmlDeviceGetTotalEnergyConsumption(self, handle, ref):
        _set(ref, self._full_gpu(handle)["energy_mj"])

    @_c_call
    def nvmlDeviceGetEnforcedPowerLimit(self, handle, ref):
        _set(ref, self._full_gpu(handle)["product_obj"].power_limit_w * 1000)

    @_c_call
    def nvmlDeviceGetPowerManagementLimit(self, handle, ref):
        _set(ref, self._full_gpu(handle)["product_obj"].power_limit_w * 1000)

    @_c_call
    def nvmlDeviceGetTemperature(self, handle, sensor, ref):
        gpu = self._full_gpu(handle)
        if _int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _set(ref, gpu["temperature"])

    @_c_call
    def nvmlDeviceGetUtilizationRates(self, handle, ref):
        gpu = self._full_gpu(handle)
        if gpu["mig"][0]:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = _target(ref)
        util.gpu = int(round(gpu["activity"] * 100))
        util.memory = int(round(gpu["activity"] * 55))

    @_c_call
    def nvmlDeviceGetEccMode(self, handle, current, pending):
        self._full_gpu(handle)
        _set(current, pynvml.NVML_FEATURE_ENABLED)
        _set(pending, pynvml.NVML_FEATURE_ENABLED)

    @_c_call
    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type, ref):
        gpu = self._full_gpu(handle)
        kind, counter = _int(error_type), _int(counter_type)
        if kind not in (0, 1) or counter not in (0, 1):
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _set(ref, gpu["ecc"][counter * 2 + kind])

    @_c_call
    def nvmlDeviceGetRemappedRows(self, handle, corr, unc, pending, failure):
        gpu = self._full_gpu(handle)
        values = gpu["remapped_rows"]
        for ref, value in zip((corr, unc, pending, failure), values, strict=True):
            _set(ref, value)

    @_c_call
    def nvmlDeviceGetRetiredPages(self, handle, cause, count, addresses):
        self._full_gpu(handle)
        raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @_c_call
    def nvmlDeviceGetRetiredPages_v2(self, handle, cause, count, addresses, timestamps):
        self._full_gpu(handle)
        raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @_c_call
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle, ref):
        _set(ref, self._full_gpu(handle)["clocks_event_reasons"])

    @_c_call
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle, ref):
        _set(ref, self._full_gpu(handle)["clocks_event_reasons"])

    @_c_call
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, infos):
        gpu, gi, _ = self._device(handle)
        procs = gpu["processes"] if gi is None else [p for p in gpu["processes"] if p["gi"] == gi["id"]]
        if infos is None:
            _set(count, len(procs))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if procs else None
        capacity = _int(_target(count))
        if capacity < len(procs):
            _set(count, len(procs))
            raise _Return(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        out = _out_array(infos, len(procs))
        for i, proc in enumerate(procs):
            out[i].pid = proc["pid"]
            out[i].usedGpuMemory = proc["used_bytes"]
            out[i].gpuInstanceId = _UNAVAILABLE if proc["gi"] is None else proc["gi"]
            out[i].computeInstanceId = _UNAVAILABLE if proc["gi"] is None else 0
        _set(count, len(procs))

    @_c_call
    def nvmlDeviceGetProcessUtilization(self, handle, samples, count, last_seen):
        """Per-process SM utilisation of a whole GPU (NOT_SUPPORTED on a MIG device, as on hardware)."""
        gpu = self._full_gpu(handle)
        procs = gpu["processes"]
        if samples is None:
            _set(count, len(procs))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if procs else pynvml.NVML_ERROR_NOT_FOUND
        out = _out_array(samples, len(procs))
        for i, proc in enumerate(procs):
            out[i].pid = proc["pid"]
            out[i].timeStamp = int(self._current()["snap"]["time"] * 1_000_000)
            out[i].smUtil = int(proc.get("sm_util", 0))
            out[i].memUtil = 0
            out[i].encUtil = 0
            out[i].decUtil = 0
        _set(count, len(procs))

    # --- clocks, performance state, power limits, BAR1, field values -----------------------

    @staticmethod
    def _board(gpu: dict) -> Board:
        return BOARDS.get(gpu["product"], _DEFAULT_BOARD)

    def _clock(self, handle, clock_type, *, maximum: bool) -> int:
        gpu = self._full_gpu(handle)
        board, kind = self._board(gpu), _int(clock_type)
        busy = maximum or gpu["activity"] >= _IDLE_ACTIVITY
        if kind in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return board.sm_mhz if busy else _IDLE_SM_MHZ
        if kind == pynvml.NVML_CLOCK_MEM:
            return board.mem_mhz  # HBM runs at its one clock
        if kind == pynvml.NVML_CLOCK_VIDEO:
            return board.video_mhz if busy else _IDLE_VIDEO_MHZ
        raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    @_c_call
    def nvmlDeviceGetClockInfo(self, handle, clock_type, ref):
        _set(ref, self._clock(handle, clock_type, maximum=False))

    @_c_call
    def nvmlDeviceGetMaxClockInfo(self, handle, clock_type, ref):
        _set(ref, self._clock(handle, clock_type, maximum=True))

    @_c_call
    def nvmlDeviceGetPerformanceState(self, handle, ref):
        self._full_gpu(handle)
        _set(ref, pynvml.NVML_PSTATE_0)  # data-centre boards in persistence mode stay in P0

    @_c_call
    def nvmlDeviceGetComputeMode(self, handle, ref):
        self._full_gpu(handle)
        _set(ref, pynvml.NVML_COMPUTEMODE_DEFAULT)

    @_c_call
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle, ref):
        _set(ref, self._full_gpu(handle)["product_obj"].power_limit_w * 1000)

    @_c_call
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle, minimum, maximum):
        gpu = self._full_gpu(handle)
        _set(minimum, self._board(gpu).min_power_w * 1000)
        _set(maximum, gpu["product_obj"].power_limit_w * 1000)

    @_c_call
    def nvmlDeviceGetBAR1MemoryInfo(self, handle, ref):
        gpu = self._full_gpu(handle)
        info = _target(ref)
        total = self._board(gpu).bar1_mib * 1024 * 1024
        used = min(total, 2 * 1024 * 1024 + gpu["used_bytes"] // 64)  # mappings grow with allocations
        info.bar1Total, info.bar1Used, info.bar1Free = total, used, total - used

    @_c_call
    def nvmlDeviceGetFieldValues(self, handle, count, values):
        gpu = self._full_gpu(handle)
        out = _out_array(values, _int(count))
        now_us = int(self._current()["snap"]["time"] * 1_000_000)
        for i in range(_int(count)):
            value = out[i]
            value.timestamp, value.latencyUsec = now_us, 0
            known = _FIELDS.get(int(value.fieldId))
            if known is None:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            value_type, read = known
            value.valueType, value.nvmlReturn = value_type, pynvml.NVML_SUCCESS
            if value_type == _ULL:
                value.value.ullVal = int(read(gpu))
            else:
                value.value.uiVal = int(read(gpu))

    # --- GPM ----------------------------------------------------------------------------

    @_c_call
    def nvmlGpmQueryDeviceSupport(self, handle, ref):
        gpu, _, _ = self._device(handle)
        support = _target(ref)
        if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            raise _Return(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        support.isSupportedDevice = 1 if gpu["product_obj"].architecture >= pynvml.NVML_DEVICE_ARCH_HOPPER else 0

    @_c_call
    def nvmlGpmSampleAlloc(self, ref):
        self._serial += 1
        desc = ("gpm", self._serial)
        self._gpm[self._address_of(desc)] = {"filled": False}
        _store_pointer(ref, self._address_of(desc))

    def _sample(self, sample) -> dict:
        record = self._gpm.get(_address(sample))
        if record is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return record

    @_c_call
    def nvmlGpmSampleFree(self, sample):
        self._sample(sample)
        del self._gpm[_address(sample)]

    def _gpm_gpu(self, handle) -> dict:
        gpu, gi, _ = self._device(handle)
        if gi is not None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu["product_obj"].architecture < pynvml.NVML_DEVICE_ARCH_HOPPER:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    @_c_call
    def nvmlGpmSampleGet(self, handle, sample):
        record = self._sample(sample)
        gpu = self._gpm_gpu(handle)
        record.update(
            filled=True, scope=("gpu", gpu["index"]), activity=gpu["activity"], time=self._current()["snap"]["time"]
        )

    @_c_call
    def nvmlGpmMigSampleGet(self, handle, gi_id, sample):
        record = self._sample(sample)
        gpu = self._gpm_gpu(handle)
        gi = gpu["gis"].get(_int(gi_id))
        if not gpu["mig"][0] or gi is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        record.update(
            filled=True,
            scope=("gi", gpu["index"], gi["id"]),
            activity=gi["activity"],
            time=self._current()["snap"]["time"],
        )

    @_c_call
    def nvmlGpmMetricsGet(self, ref):
        request = _target(ref)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _Return(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = self._sample(request.sample1), self._sample(request.sample2)
        if not (first["filled"] and second["filled"]) or first["scope"] != second["scope"]:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        activity = (first["activity"] + second["activity"]) / 2
        for i in range(min(int(request.numMetrics), len(request.metrics))):
            metric = request.metrics[i]
            share = _GPM_SHARES.get(int(metric.metricId))
            if share is None:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
            else:
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, round(100.0 * activity * share, 3)

    # --- events -------------------------------------------------------------------------

    @_c_call
    def nvmlEventSetCreate(self, ref):
        self._serial += 1
        desc = ("evset", self._serial)
        self._event_sets[self._address_of(desc)] = {"masks": {}, "after": None, "queue": []}
        _store_pointer(ref, self._address_of(desc))

    def _event_set(self, handle) -> dict:
        record = self._event_sets.get(_address(handle))
        if record is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return record

    @_c_call
    def nvmlDeviceGetSupportedEventTypes(self, handle, ref):
        self._full_gpu(handle)
        _set(ref, _SUPPORTED_EVENTS)

    @_c_call
    def nvmlDeviceRegisterEvents(self, handle, event_types, event_set):
        gpu = self._full_gpu(handle)
        record = self._event_set(event_set)
        mask = _int(event_types)
        if mask & ~_SUPPORTED_EVENTS:
            raise _Return(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if record["after"] is None:
            record["after"] = self._refresh()["snap"]["event_seq"]
        record["masks"][gpu["index"]] = record["masks"].get(gpu["index"], 0) | mask

    @_c_call
    def nvmlEventSetWait_v2(self, event_set, ref, timeout_ms):
        record = self._event_set(event_set)
        if not record["queue"] and record["masks"] and _int(timeout_ms) == 0 and self._nothing_new(record):
            raise _Return(pynvml.NVML_ERROR_TIMEOUT)
        if not record["queue"] and record["masks"]:
            self._lock.release()  # let other threads use the library while we long-poll
            try:
                events = self._backend.events(record["after"] or 0, record["masks"], _int(timeout_ms) / 1000.0)
            finally:
                self._lock.acquire()
            record["queue"].extend(events)
            if events:
                record["after"] = max(e["seq"] for e in events)
        if not record["queue"]:
            raise _Return(pynvml.NVML_ERROR_TIMEOUT)
        event = record["queue"].pop(0)
        data = _target(ref)
        data.device = self._pointer(("gpu", event["gpu"]), pynvml.c_nvmlDevice_t)
        data.eventType = event["type"]
        data.eventData = event["data"]
        data.gpuInstanceId = event["gi"]
        data.computeInstanceId = event["ci"]

    def _nothing_new(self, record: dict) -> bool:
        """True when a cached snapshot younger than EVENT_SNAPSHOT_S shows no event after the set's last one: a
        poll's drain (timeout 0) then needs no round trip. An event raised since that snapshot is drained by the
        next poll. In-process libraries (max_age 0) always ask."""
        return (
            self._max_age > 0
            and self._view is not None
            and time.monotonic() - self._fetched <= EVENT_SNAPSHOT_S
            and self._view["snap"]["event_seq"] <= (record["after"] or 0)
        )

    @_c_call
    def nvmlEventSetFree(self, event_set):
        self._event_set(event_set)
        del self._event_sets[_address(event_set)]


class _LibraryProxy:
    """What pynvml sees as `nvmlLib`: getattr(lib, "nvmlFoo") -> a C-like function.

    Only simulated entry points resolve (others raise AttributeError, which pynvml turns
    into NVMLError_FunctionNotFound). Calls are serialised on the library's lock, and each
    symbol is a plain function so pynvml may set `.restype` on it (nvmlErrorString does).
    """

    def __init__(self, library: SimulatedLibrary):
        self._library = library

    def __getattr__(self, name: str):
        implementation = getattr(SimulatedLibrary, name, None)  # its own entry points and its mixins' (nvml_vgpu)
        if implementation is None or not getattr(implementation, "c_symbol", False):
            raise AttributeError(name)
        library = self._library

        def symbol(*args):
            with library._lock:
                return implementation(library, *args)

        symbol.__name__ = name
        return symbol


# ----------------------------------------------------------------------------------------
# Re-hosting pynvml's Python layer


_MODULE_DUNDERS = {"__name__", "__doc__", "__loader__", "__spec__", "__file__", "__cached__", "__package__"}


def _rehost_pynvml(library: SimulatedLibrary, name: str) -> types.ModuleType:
    """A copy of the pynvml module whose C calls go to `library` (see module docstring)."""
    module = types.ModuleType(name, "pynvml re-hosted on a simulated NVML library (simcluster)")
    namespace = module.__dict__
    original = pynvml.__dict__
    namespace.update({k: v for k, v in original.items() if k not in _MODULE_DUNDERS})
    namespace.update(nvmlLib=None, _nvmlGetFunctionPointer_cache={}, _nvmlLib_refcount=0, libLoadLock=threading.Lock())
    rebuilt: dict[int, types.FunctionType] = {}

    def rebuild(fn):
        if not isinstance(fn, types.FunctionType) or fn.__globals__ is not original:
            return fn
        if id(fn) in rebuilt:
            return rebuilt[id(fn)]
        closure = None
        if fn.__closure__:
            cells = []
            for cell in fn.__closure__:
                try:
                    cells.append(types.CellType(rebuild(cell.cell_contents)))
                except ValueError:  # empty cell
                    cells.append(types.CellType())
            closure = tuple(cells)
        copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, closure)
        rebuilt[id(fn)] = copy
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__ = fn.__qualname__
        copy.__doc__ = fn.__doc__
        copy.__module__ = name
        copy.__dict__.update({k: rebuild(v) for k, v in fn.__dict__.items()})
        return copy

    for key, value in list(namespace.items()):
        namespace[key] = rebuild(value)

    def _LoadNvmlLibrary():  # noqa: N802 - pynvml's name
        if namespace["nvmlLib"] is None:
            namespace["nvmlLib"] = _LibraryProxy(library)

    namespace["_LoadNvmlLibrary"] = _LoadNvmlLibrary
    namespace["simcluster_library"] = library
    namespace["pod_uid_for_pid"] = library.pod_uid_for_pid
    return module


# ----------------------------------------------------------------------------------------
# Factories

_local_servers: dict[str, tuple[object, str | None]] = {}
_libraries: dict[tuple, types.ModuleType] = {}
_factory_lock = threading.Lock()


def register_local(url: str, state, cluster: str | None) -> None:
    """Called by SimServer: URLs it serves in this process use the in-process fast path."""
    with _factory_lock:
        _local_servers[url.rstrip("/")] = (state, cluster)


def unregister_local(url: str) -> None:
    with _factory_lock:
        _local_servers.pop(url.rstrip("/"), None)
        for key in [k for k in _libraries if k[0] == url.rstrip("/")]:
            del _libraries[key]


def library_for_state(state, cluster: str | None, node_name: str, *, privileged: bool = True) -> types.ModuleType:
    """A pynvml-compatible library for a node of an in-process SimState (no server needed)."""
    library = SimulatedLibrary(LocalBackend(state, cluster, node_name), max_age=0.0, privileged=privileged)
    return _rehost_pynvml(library, f"simcluster.nvml[{cluster or ''}/{node_name}]")


def library_for_node(
    api_url: str,
    node_name: str,
    *,
    token: str | None = None,
    max_age: float | None = None,
    transport: str = "auto",
    privileged: bool = True,
) -> types.ModuleType:
    """The NVML library of `node_name` in the simulated cluster served at `api_url`.

    The signature production code relies on is `library_for_node(api_url, node_name)`
    (for real hardware the factory returns the `pynvml` module). One library per
    (api_url, node) per process, like the process-wide real pynvml. `transport`: "auto"
    (in-process when this process runs the SimServer for that URL, else HTTP), "http" or
    "local". `max_age`: seconds a snapshot is reused (default 1.0 over HTTP, 0 locally).
    `privileged=False`: an agent without root (NVML_ERROR_NO_PERMISSION, see PRIVILEGED_SYMBOLS).
    """
    base = api_url.rstrip("/")
    key = (base, node_name, transport, token, max_age, privileged)
    with _factory_lock:
        if key in _libraries:
            return _libraries[key]
        local = _local_servers.get(base) if transport in ("auto", "local") else None
        if transport == "local" and local is None:
            raise LookupError(f"no SimServer serving {base} in this process")
        if local is not None:
            backend = LocalBackend(local[0], local[1], node_name)
            age = 0.0 if max_age is None else max_age
        else:
            backend = HttpBackend(base, node_name, token=token)
            age = 1.0 if max_age is None else max_age
        library = SimulatedLibrary(backend, max_age=age, privileged=privileged)
        module = _rehost_pynvml(library, f"simcluster.nvml[{base}/{node_name}]")
        _libraries[key] = module
        return module


def unprivileged_library_for_node(api_url: str, node_name: str) -> types.ModuleType:
    """NVML_LIBRARY factory for an unprivileged node agent (the unkind world of docs/simcluster.md)."""
    return library_for_node(api_url, node_name, privileged=False)
