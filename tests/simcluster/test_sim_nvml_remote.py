"""library_for_node from ANOTHER process (as the Celery worker uses it): NVML over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pynvml
import pytest

from simcluster.nvml import library_for_node

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent("""
    import json, sys
    from ctypes import byref
    import pynvml
    from simcluster.nvml import library_for_node

    url, node = sys.argv[1], sys.argv[2]
    lib = library_for_node(url, node)
    backend = lib.simcluster_library._backend
    lib.nvmlInit()
    out = {"backend": type(backend).__name__, "count": lib.nvmlDeviceGetCount()}
    gpus = []
    for i in range(out["count"]):
        h = lib.nvmlDeviceGetHandleByIndex(i)
        gpus.append([lib.nvmlDeviceGetUUID(h), lib.nvmlDeviceGetName(h), lib.nvmlDeviceGetPciInfo(h).busId,
                     lib.nvmlDeviceGetMigMode(h), lib.nvmlDeviceGetPowerUsage(h),
                     len(lib.nvmlDeviceGetComputeRunningProcesses(h))])
    out["gpus"] = gpus
    out["read_round_trips"] = backend.requests
    h = lib.nvmlDeviceGetHandleByIndex(7)  # GPUs 0-3 run the llm-train pods
    lib.nvmlDeviceSetMigMode(h, 1)
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 0, 4
    gi = lib.nvmlDeviceCreateGpuInstanceWithPlacement(h, 5, byref(placement))
    lib.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE)
    out["mig_uuid"] = lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    try:
        lib.nvmlDeviceCreateGpuInstance(h, 0)
    except pynvml.NVMLError_InsufficientResources as exc:
        out["error"] = type(exc).__name__
    out["round_trips"] = backend.requests
    lib.nvmlShutdown()
    print(json.dumps(out))
""")


def test_nvml_over_http_from_another_process(server, prod, state):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", WORKER, server.cluster_url("prod"), "prod-h100-full-01"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    node = state.cluster("prod").nodes["prod-h100-full-01"]
    assert out["backend"] == "HttpBackend"
    assert out["count"] == 8
    assert [g[0] for g in out["gpus"]] == [g.uuid for g in node.gpus]
    assert out["gpus"][0][1:4] == ["NVIDIA H100 80GB HBM3", "00000000:18:00.0", [0, 0]]
    assert sum(g[5] for g in out["gpus"]) == 4  # the two llm-train pods hold two GPUs each
    assert out["read_round_trips"] == 1  # one snapshot served the whole inventory
    assert out["error"] == "NVMLError_InsufficientResources"
    assert out["round_trips"] == 5  # + set mode, create GI, create CI, refused create
    # The same state backs the API server: the new instance is advertised.
    assert node.gpu(7).layout() == ["4g.40gb"]
    api_node = prod.read_node("prod-h100-full-01")
    assert api_node.status.allocatable["nvidia.com/mig-4g.40gb"] == "1"
    assert node.devices["nvidia.com/mig-4g.40gb"] == [out["mig_uuid"]]


def test_a_poll_drain_without_new_events_costs_no_round_trip(server, state):
    """Over HTTP, nvmlEventSetWait(timeout 0) is answered from the session's snapshot when it shows no newer event;
    an event raised since is drained by the next session, which sees it in its snapshot and asks."""
    lib = library_for_node(server.cluster_url("prod"), "prod-h100-full-02", transport="http")
    backend = lib.simcluster_library._backend
    lib.nvmlInit()
    events = lib.nvmlEventSetCreate()
    for i in range(8):
        lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, events)
    asked = backend.requests
    with pytest.raises(pynvml.NVMLError_Timeout):
        lib.nvmlEventSetWait(events, 0)
    assert backend.requests == asked  # nothing newer in the snapshot: no round trip
    state.faults.xid("prod", "prod-h100-full-02", 5, code=48)
    with pytest.raises(pynvml.NVMLError_Timeout):
        lib.nvmlEventSetWait(events, 0)  # raised after this session's snapshot: the next poll's
    lib.nvmlShutdown()
    lib.nvmlInit()  # the next poll's session: a fresh snapshot shows the event
    data = lib.nvmlEventSetWait(events, 0)
    assert (lib.nvmlDeviceGetIndex(data.device), data.eventData) == (5, 48)
    assert backend.requests == asked + 2  # the new snapshot and the one drain that had something to fetch
    with pytest.raises(pynvml.NVMLError_Timeout):
        lib.nvmlEventSetWait(events, 0)
    assert backend.requests == asked + 2
    lib.nvmlEventSetFree(events)
    lib.nvmlShutdown()
