"""Loading the NVML library for a node and a session over it that turns NVML errors into values.

The library is not imported directly: settings.NVML_LIBRARY names a factory
`(api_url, node_name) -> pynvml-compatible object` (`local_pynvml` on real GPU nodes, the
simulator's fake NVML under the simulator). Both raise pynvml's `NVMLError_*` classes, compared
here by return code so a fake library's own error classes work too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pynvml
from django.conf import settings
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

# NVML return codes (nvml.h); compared by value so a fake library's own error classes work too.
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
NO_DATA = pynvml.NVML_ERROR_NO_DATA
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
UNAVAILABLE = frozenset({NOT_SUPPORTED, NOT_FOUND, NO_DATA, FUNCTION_NOT_FOUND})

MIB = 1024 * 1024


class NvmlError(Exception):
    """NVML could not be loaded or initialised, or a node-wide read failed."""


class GpuLost(Exception):
    """Internal: the GPU fell off the bus (NVML_ERROR_GPU_IS_LOST) while being read."""


def local_pynvml(api_url: str = "", node_name: str = "") -> Any:
    """The factory for real GPU nodes: the `pynvml` module itself (libnvidia-ml.so.1 on this host)."""
    return pynvml


@cache
def _factory(path: str) -> Callable[[str, str], Any]:
    return import_string(path)


def load_library(api_url: str, node_name: str) -> Any:
    """The pynvml-compatible library for one node, from settings.NVML_LIBRARY."""
    try:
        factory = _factory(settings.NVML_LIBRARY)
    except ImportError as exc:
        raise NvmlError(f"NVML_LIBRARY={settings.NVML_LIBRARY!r} cannot be imported: {exc}") from None
    return factory(api_url, node_name)


def error_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def is_nvml_error(exc: BaseException) -> bool:
    return isinstance(exc, pynvml.NVMLError) or type(exc).__name__.startswith("NVMLError")


class NvmlSession:
    """An initialised NVML library for one node. Read helpers translate errors into values."""

    def __init__(self, lib: Any, node_name: str = ""):
        self.lib = lib
        self.node_name = node_name
        self.denied: list[str] = []  # calls refused with NO_PERMISSION, first refusal first

    def call(self, name: str, *args) -> Any:
        """lib.<name>(*args); GpuIsLost raises GpuLost, other NVML errors propagate."""
        try:
            return getattr(self.lib, name)(*args)
        except Exception as exc:
            if is_nvml_error(exc) and error_code(exc) == GPU_IS_LOST:
                raise GpuLost(name) from None
            raise

    def optional(self, name: str, *args) -> Any:
        """Like call(), but an unavailable value (NotSupported, NotFound, NoData) is None."""
        try:
            return self.call(name, *args)
        except GpuLost:
            raise
        except Exception as exc:
            if is_nvml_error(exc) and error_code(exc) in UNAVAILABLE:
                return None
            raise

    def permitted(self, name: str, *args) -> Any:
        """Like optional(), but a call the agent lacks the privilege for is None too, and remembered in `denied`.

        A non-root node agent gets NVML_ERROR_NO_PERMISSION from the calls nvml.h marks "Requires
        privileged user" (GPU-instance queries); the rest of the node can still be read.
        """
        try:
            return self.optional(name, *args)
        except GpuLost:
            raise
        except Exception as exc:
            if is_nvml_error(exc) and error_code(exc) == NO_PERMISSION:
                if name not in self.denied:
                    self.denied.append(name)
                return None
            raise

    def pod_uid_for_pid(self, pid: int) -> str | None:
        """The pod a process belongs to: the library's own answer (simulator), else /proc/<pid>/cgroup."""
        resolver = getattr(self.lib, "pod_uid_for_pid", None)
        if resolver is not None:
            return resolver(pid)
        if self.lib is pynvml:
            return pod_uid_from_cgroup(pid)
        return None


@contextmanager
def session(api_url: str = "", node_name: str = "") -> Iterator[NvmlSession]:
    """nvmlInit() ... nvmlShutdown() around the block; NvmlError if the library cannot start."""
    lib = load_library(api_url, node_name)
    try:
        lib.nvmlInit()
    except Exception as exc:
        if is_nvml_error(exc):
            raise NvmlError(f"nvmlInit on {node_name or 'this host'} failed: {exc}") from None
        raise
    try:
        yield NvmlSession(lib, node_name)
    finally:
        try:
            lib.nvmlShutdown()
        except Exception as exc:  # a failed shutdown must not hide the block's own result
            logger.warning("nvmlShutdown on %s failed: %s", node_name, exc)


@contextmanager
def node_errors(node_name: str) -> Iterator[None]:
    """NVML failures of the block (a lost GPU too) as NvmlError naming the node: the node's poll cannot start."""
    try:
        yield
    except GpuLost as exc:
        raise NvmlError(f"{node_name}: {exc}") from None
    except Exception as exc:
        if is_nvml_error(exc):
            raise NvmlError(f"{node_name}: {exc}") from None
        raise


def as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def mib(value: Any) -> int | None:
    return None if value is None else int(value) // MIB


# kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice
# or cgroupfs: /kubepods/besteffort/pod<uid>/<container>
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def pod_uid_from_cgroup(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The pod UID in a process's cgroup path (the node agent needs hostPID), or None."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-") if match else None
