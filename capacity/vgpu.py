"""NVIDIA vGPU types for virtual machines, as the GPU Operator serves them (KubeVirt, vm-vgpu).

A node labelled `nvidia.com/gpu.workload.config=vm-vgpu` runs the vGPU manager; the vGPU device
manager carves each GPU into vGPUs of one type (its config names e.g. `A100-40C: 1`), and the
sandbox device plugin advertises each type as an extended resource: `nvidia.com/NVIDIA_A100-40C`
(the mdev type's name with spaces as underscores). A KubeVirt VM asks for that resource.

Facts, with sources in docs/vgpu.md: C-series (compute) types of the NVIDIA Virtual GPU Software
user guide's "Virtual GPU Types for Supported GPUs" tables; every name and vGPUs-per-GPU count below
is the one in NVIDIA/vgpu-device-manager examples/config-example.yaml (its `vgpu-configs`, one config
per type, `devices: all`). Time-sliced vGPUs (these) get dedicated framebuffer and a time-sliced share
of the GPU's compute (best-effort scheduler by default); performance overhead against bare metal is
5-15% (the seed). MIG-backed types (`H100XM-1-10C`, ...) are not offered.

The device manager (NVIDIA/vgpu-device-manager cmd/nvidia-k8s-vgpu-dm) applies the config the node
label `nvidia.com/vgpu.config` names from its ConfigMap's `config.yaml` and reports progress in
`nvidia.com/vgpu.config.state` (pending, then success or failed).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

WORKLOAD_CONFIG_LABEL = "nvidia.com/gpu.workload.config"
VM_VGPU = "vm-vgpu"
VGPU_CONFIG_LABEL = "nvidia.com/vgpu.config"
VGPU_CONFIG_STATE_LABEL = "nvidia.com/vgpu.config.state"
DEVICE_MANAGER_KEY = "config.yaml"
RESOURCE_PREFIX = "nvidia.com/NVIDIA_"
# The seed: "expect 5-15% lower performance than bare metal".
OVERHEAD_RANGE_PCT = (5, 15)


@dataclass(frozen=True)
class VgpuType:
    name: str  # "H100XM-20C"
    product: str  # gpuaas catalog key of the physical GPU: "H100-80GB"
    framebuffer_gb: int
    max_per_gpu: int  # equal-size mode

    @property
    def resource_name(self) -> str:
        return f"{RESOURCE_PREFIX}{self.name}"

    @property
    def permitted_device(self) -> dict:
        """Its entry in the KubeVirt CR's spec.configuration.permittedHostDevices.mediatedDevices: the mdev type's
        name, the sandbox device plugin's resource, provided by that plugin (externalResourceProvider)."""
        return {
            "mdevNameSelector": f"NVIDIA {self.name}",
            "resourceName": self.resource_name,
            "externalResourceProvider": True,
        }

    @property
    def compute_share(self) -> Fraction:
        """The time-sliced share of the GPU's compute each vGPU gets when all are busy."""
        return Fraction(1, self.max_per_gpu)


def _types(prefix: str, product: str, sizes: list[tuple[int, int]]) -> list[VgpuType]:
    return [VgpuType(f"{prefix}-{gb}C", product, gb if gb != 81 else 80, n) for gb, n in sizes]


# (framebuffer GB as the type name says it, vGPUs per GPU). H100 80GB: "80C" offers 81 GB in the table.
# 16C: 5 per GPU (config-example.yaml `H100XM-16C: 5`; 5 x 16 GB fills 80 GB, 6 would not).
_H100 = [(80, 1), (40, 2), (20, 4), (16, 5), (10, 8), (8, 10), (5, 16), (4, 20)]
# H200 141GB (config-example.yaml `H200X-*` for the SXM5 board, `H200-*` for H200 NVL): 141C x1 ... 4C x32.
_H200 = [(141, 1), (70, 2), (35, 4), (28, 5), (17, 8), (14, 10), (8, 16), (7, 20), (4, 32)]
_A100_40 = [(40, 1), (20, 2), (10, 4), (8, 5), (5, 8), (4, 10)]
_A100_80 = [(80, 1), (40, 2), (20, 4), (16, 5), (10, 8), (8, 10), (4, 20)]

VGPU_TYPES: dict[str, VgpuType] = {
    t.name: t
    for t in [
        *_types("H100", "H100-80GB", _H100),  # H100 PCIe 80GB
        *_types("H100XM", "H100-80GB", _H100),  # H100 SXM5 80GB (HGX)
        *_types("A100", "A100-40GB", _A100_40),  # A100 PCIe 40GB
        *_types("A100D", "A100-80GB", _A100_80),  # A100 PCIe 80GB
        *_types("H200X", "H200-141GB", _H200),  # H200 SXM5 141GB (HGX)
        *_types("H200", "H200-141GB-NVL", _H200),  # H200 NVL (PCIe) 141GB
    ]
}


def vgpu_type_for_resource(resource_name: str) -> VgpuType | None:
    """The vGPU type an extended resource advertises, or None (not a vGPU resource, or a type we do not know)."""
    if not resource_name.startswith(RESOURCE_PREFIX):
        return None
    return VGPU_TYPES.get(resource_name.removeprefix(RESOURCE_PREFIX))


def is_vgpu_node(labels: dict[str, str]) -> bool:
    return labels.get(WORKLOAD_CONFIG_LABEL) == VM_VGPU


def types_for_product(product: str) -> list[VgpuType]:
    """The catalog's vGPU types of one physical GPU (gpuaas catalog key), smallest framebuffer first."""
    return sorted((t for t in VGPU_TYPES.values() if t.product == product), key=lambda t: (t.framebuffer_gb, t.name))


def device_manager_document() -> dict:
    """The vGPU device manager's config file: one config per catalog type, named after it, that carves every
    GPU of the node into that type's vGPUs (the shape of NVIDIA/vgpu-device-manager's
    examples/config-example.yaml: `version: v1`, `vgpu-configs: {NAME: [{devices: all, vgpu-devices: {TYPE: N}}]}`).
    One document serves the fleet: gpuaas labels a node only with a type of its own GPU (capacity.services.vgpu)."""
    return {
        "version": "v1",
        "vgpu-configs": {
            t.name: [{"devices": "all", "vgpu-devices": {t.name: t.max_per_gpu}}]
            for t in sorted(VGPU_TYPES.values(), key=lambda t: t.name)
        },
    }


def configured_types(config: str) -> dict[str, int] | None:
    """The vGPU types, and vGPUs per GPU of each, that the device manager config `config` (a node's
    nvidia.com/vgpu.config label) gives every GPU; None for no label or a config gpuaas's document does not
    hold (an operator's own: the node is then taken at what its device plugin advertises)."""
    entries = device_manager_document()["vgpu-configs"].get(config)
    if not entries:
        return None
    types: dict[str, int] = {}
    for entry in entries:
        for name, count in entry["vgpu-devices"].items():
            types[name] = max(types.get(name, 0), int(count))
    return types
