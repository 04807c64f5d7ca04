"""The fake NVML returns what real H100 / H200 boards return (tests/fixtures/nvml/, sources in its README).

Each recorded `nvidia-smi -q` / `nvidia-smi mig -lgip` / `-lgipp` value is read back through the simulator's
pynvml-compatible library for a simulated GPU of the same product, with the NVML call nvidia-smi makes for it.
"""

from __future__ import annotations

import re
from ctypes import byref, c_uint
from pathlib import Path

import pynvml
import pytest

from capacity.mig.catalog import get_product
from simcluster import Scenario, library_for_state

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvml"
MIB = 1024 * 1024
PRODUCTS = {  # fixture stem -> catalog key
    "h100-80gb-hbm3": "H100-80GB",
    "h100-nvl": "H100-94GB-NVL",
    "h200": "H200-141GB",
}
# Explained differences (README): the recorded H100 NVL runs a site-set 310 W default limit; the catalog keeps
# the 400 W an Azure H100 NVL shows, which is also this board's recorded maximum.
KNOWN_DIFFERENCES = {("h100-nvl", "GPU Power Readings/Default Power Limit"): ("310.00 W", "400.00 W")}

_KV = re.compile(r"^( *)(\S.*?)\s+: (.*)$")
_SECTION = re.compile(r"^( *)(\S.*)$")
_LGIP = re.compile(r"^\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+\w+\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$")
_LGIP_2 = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$")
_LGIPP = re.compile(r"Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)$")
_GI_INDEXES = (
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
)


def smi_q(stem: str) -> dict[str, str]:
    """`nvidia-smi -q` text as {"Section/Key": value}, for the first GPU."""
    values: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in (FIXTURES / f"{stem}.nvidia-smi-q.txt").read_text().splitlines():
        match = _KV.match(line) or _SECTION.match(line)
        if not match or line.startswith("="):
            continue
        indent = len(match.group(1))
        stack = [(i, name) for i, name in stack if i < indent]
        if match.re is _KV:
            values["/".join([n for _, n in stack[1:]] + [match.group(2)])] = match.group(3)
        else:
            stack.append((indent, match.group(2)))
    return values


def lgip(stem: str) -> dict[str, dict]:
    """`nvidia-smi mig -lgip` rows by profile name, with the `-lgipp` placements."""
    rows: dict[str, dict] = {}
    last = None
    placements = {}
    for line in (FIXTURES / f"{stem}.mig-lgip.txt").read_text().splitlines():
        if match := _LGIP.match(line):
            name, pid, free, total, gib, sm, dec, enc = match.groups()
            last = rows[name] = {
                "id": int(pid),
                "free": int(free),
                "total": int(total),
                "gib": gib,
                "sm": int(sm),
                "dec": int(dec),
                "enc": int(enc),
            }
        elif (match := _LGIP_2.match(line)) and last is not None:
            last["ce"], last["jpeg"], last["ofa"] = (int(v) for v in match.groups())
            last = None
        elif match := _LGIPP.search(line):
            placements[int(match.group(1))] = [(int(s), int(match.group(3))) for s in match.group(2).split(",")]
    for row in rows.values():
        row["placements"] = placements[row["id"]]
    return rows


@pytest.fixture(scope="module")
def state():
    groups = []
    for stem, key in PRODUCTS.items():
        groups.append(
            {"name_prefix": f"{stem}-off", "count": 1, "product": key, "gpus_per_node": 1, "mig_strategy": "none"}
        )
        groups.append(
            {
                "name_prefix": f"{stem}-mig",
                "count": 1,
                "product": key,
                "gpus_per_node": 1,
                "mig_strategy": "mixed",
                "mig_layout": "all-enabled",
            }
        )
    spec = {"name": "nvml-values", "seed": 3, "clusters": [{"name": "lab", "node_groups": groups}]}
    return Scenario.from_dict(spec).build()


@pytest.fixture
def gpu(state):
    opened = []

    def open_gpu(node: str):
        lib = library_for_state(state, "lab", node)
        lib.nvmlInit()
        opened.append(lib)
        return lib, lib.nvmlDeviceGetHandleByIndex(0)

    yield open_gpu
    for lib in opened:
        lib.nvmlShutdown()


def _watts(mw: int) -> str:
    return f"{mw / 1000:.2f} W"


@pytest.mark.parametrize("stem", sorted(PRODUCTS))
def test_fake_nvml_reads_the_recorded_nvidia_smi_q_values(gpu, stem):
    real = smi_q(stem)
    lib, h = gpu(f"{stem}-off-01")
    low, high = lib.nvmlDeviceGetPowerManagementLimitConstraints(h)
    mig_current, mig_pending = lib.nvmlDeviceGetMigMode(h)
    ecc_current, ecc_pending = lib.nvmlDeviceGetEccMode(h)
    corrected, uncorrected, pending, failed = lib.nvmlDeviceGetRemappedRows(h)
    sim = {
        "Product Name": lib.nvmlDeviceGetName(h),
        "MIG Mode/Current": "Enabled" if mig_current else "Disabled",
        "MIG Mode/Pending": "Enabled" if mig_pending else "Disabled",
        "PCI/Device Id": f"0x{lib.nvmlDeviceGetPciInfo(h).pciDeviceId:08X}",
        "Performance State": f"P{lib.nvmlDeviceGetPerformanceState(h)}",
        "FB Memory Usage/Total": f"{lib.nvmlDeviceGetMemoryInfo(h).total // MIB} MiB",
        "BAR1 Memory Usage/Total": f"{lib.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total // MIB} MiB",
        "Compute Mode": "Default" if lib.nvmlDeviceGetComputeMode(h) == pynvml.NVML_COMPUTEMODE_DEFAULT else "?",
        "ECC Mode/Current": "Enabled" if ecc_current else "Disabled",
        "ECC Mode/Pending": "Enabled" if ecc_pending else "Disabled",
        "Remapped Rows/Correctable Error": str(corrected),
        "Remapped Rows/Uncorrectable Error": str(uncorrected),
        "Remapped Rows/Pending": "Yes" if pending else "No",
        "Remapped Rows/Remapping Failure Occurred": "Yes" if failed else "No",
        "GPU Power Readings/Current Power Limit": _watts(lib.nvmlDeviceGetEnforcedPowerLimit(h)),
        "GPU Power Readings/Default Power Limit": _watts(lib.nvmlDeviceGetPowerManagementDefaultLimit(h)),
        "GPU Power Readings/Min Power Limit": _watts(low),
        "GPU Power Readings/Max Power Limit": _watts(high),
        "Clocks/Graphics": f"{lib.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS)} MHz",
        "Clocks/SM": f"{lib.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)} MHz",
        "Clocks/Video": f"{lib.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_VIDEO)} MHz",
        "Max Clocks/Graphics": f"{lib.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS)} MHz",
        "Max Clocks/SM": f"{lib.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)} MHz",
        "Max Clocks/Memory": f"{lib.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)} MHz",
        "Max Clocks/Video": f"{lib.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_VIDEO)} MHz",
    }
    # The recorded H100 NVL's current limit is its site-set default; the simulator enforces its default too.
    real_current = real["GPU Power Readings/Current Power Limit"]
    assert real_current == real["GPU Power Readings/Default Power Limit"]
    for key, value in sim.items():
        if (stem, key) in KNOWN_DIFFERENCES or (stem, key.replace("Current", "Default")) in KNOWN_DIFFERENCES:
            expected_real, expected_sim = KNOWN_DIFFERENCES[(stem, key.replace("Current", "Default"))]
            assert (real[key], value) == (expected_real, expected_sim), key
            continue
        assert value == real[key], key
    assert lib.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
    assert lib.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_HOPPER


@pytest.mark.parametrize("stem", sorted(s for s in PRODUCTS if (FIXTURES / f"{s}.mig-lgip.txt").exists()))
def test_fake_nvml_reads_the_recorded_gpu_instance_profiles(gpu, stem):
    real = lgip(stem)
    lib, h = gpu(f"{stem}-mig-01")
    sim = {}
    for index in _GI_INDEXES:
        info = lib.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
        count = c_uint(0)
        lib.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, placements, byref(count))
        sim[info.name.removeprefix("MIG ")] = {
            "id": info.id,
            "free": lib.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id),
            "total": info.instanceCount,
            "gib": f"{info.memorySizeMB / 1024:.2f}",
            "sm": info.multiprocessorCount,
            "dec": info.decoderCount,
            "enc": info.encoderCount,
            "ce": info.copyEngineCount,
            "jpeg": info.jpegCount,
            "ofa": info.ofaCount,
            "placements": [(placements[i].start, placements[i].size) for i in range(count.value)],
        }
    assert sim == real
    catalog = get_product(PRODUCTS[stem])
    assert {p.name for p in catalog.profiles} == set(real)
