"""The ctypes side of the simulated libnvidia-ml (simcluster.nvml): out-parameters, strings, arrays, and the
wrapper that turns a Python method into a C entry point returning NVML return codes."""

from __future__ import annotations

import ctypes

import pynvml

from . import driver

# The C symbols nvml.h documents as "Requires privileged user" (or root): a non-root agent without the
# /proc/driver/nvidia/capabilities/mig/{config,monitor} capabilities gets NVML_ERROR_NO_PERMISSION.
PRIVILEGED_SYMBOLS = frozenset(
    {
        "nvmlDeviceSetMigMode",
        "nvmlDeviceCreateGpuInstance",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlDeviceGetGpuInstances",
        "nvmlDeviceGetGpuInstanceById",
        "nvmlDeviceGetGpuInstanceRemainingCapacity",
        "nvmlGpuInstanceDestroy",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
        "nvmlGpuInstanceGetComputeInstances",
        "nvmlGpuInstanceGetComputeInstanceById",
        "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
        "nvmlComputeInstanceDestroy",
    }
)


class _Return(Exception):
    """Internal: abort a simulated C call with an NVML return code."""

    def __init__(self, code: int):
        self.code = code


class TransportError(Exception):
    """The simulator could not be reached or answered something unexpected."""


def _target(ref):
    """What an out-parameter points at: byref(x) -> x, pointer(x) -> x, x -> x."""
    obj = getattr(ref, "_obj", None)
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    return ref


def _set(ref, value) -> None:
    _target(ref).value = value


def _int(value) -> int:
    return int(value.value) if hasattr(value, "value") else int(value)


def _bytes_in(value) -> bytes:
    raw = value.value if hasattr(value, "value") else value
    return raw if isinstance(raw, bytes) else str(raw).encode()


def _write_string(buf, size, text: str) -> None:
    data = text.encode()
    if len(data) + 1 > _int(size):
        raise _Return(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    buf.value = data


def _address(handle) -> int | None:
    """The address a handle holds. Every simulated call resolves one: a typed pointer's `contents` is several
    times cheaper than ctypes.cast, which stays for NULL, void pointers and the like."""
    if handle is None:
        return None
    try:
        return ctypes.addressof(handle.contents)
    except (AttributeError, TypeError, ValueError):
        pass
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except ctypes.ArgumentError:
        return None


def _store_pointer(ref, address: int) -> None:
    target = _target(ref)
    ctypes.cast(ctypes.pointer(target), ctypes.POINTER(ctypes.c_void_p))[0] = address


def _out_array(ref, count: int):
    """A ctypes array view of `count` elements where the caller's buffer lives.

    A real array is bounds-checked (NVML_ERROR_INSUFFICIENT_SIZE); a pointer to a single
    element is written through like C would.
    """
    target = _target(ref)
    if isinstance(target, ctypes.Array):
        if len(target) < count:
            raise _Return(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        return target
    if count == 0:
        return []
    return (type(target) * count).from_address(ctypes.addressof(target))


def _c_call(fn):
    """Wrap a simulated C entry point: initialisation check, NVML return codes."""
    name = fn.__name__

    def entry(self, *args):
        if name not in ("nvmlInitWithFlags", "nvmlErrorString") and self._init_count <= 0:
            return pynvml.NVML_ERROR_UNINITIALIZED
        if not self._privileged and name in PRIVILEGED_SYMBOLS:
            return pynvml.NVML_ERROR_NO_PERMISSION
        try:
            result = fn(self, *args)
        except _Return as ret:
            return ret.code
        except driver.NodeGone:
            return pynvml.NVML_ERROR_UNKNOWN
        except TransportError:
            return pynvml.NVML_ERROR_UNKNOWN
        return pynvml.NVML_SUCCESS if result is None else result

    entry.__name__ = name
    entry.c_symbol = True
    return entry
