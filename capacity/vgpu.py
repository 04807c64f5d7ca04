"""NVIDIA vGPU types for virtual machines, as the GPU Operator serves them (KubeVirt, vm-vgpu).

A node labelled `nvidia.com/gpu.workload.config=vm-vgpu` runs the vGPU manager; the vGPU device
manager carves each GPU into vGPUs of one type (its config names e.g. `A100-40C: 1`), and the
sandbox device plugin advertises each type as an extended resource: `nvidia.com/NVIDIA_A100-40C`
(the mdev type's name with spaces as underscores). A KubeVirt VM asks for that resource.

Facts, with sources in docs/tiers.md: C-series (compute) types of the NVIDIA Virtual GPU Software
user guide's "Virtual GPU Types for Supported GPUs" tables; the same names and counts appear in
NVIDIA/vgpu-device-manager examples/config-example.yaml. Time-sliced vGPUs (these) get dedicated
framebuffer and a time-sliced share of the GPU's compute (best-effort scheduler by default);
performance overhead against bare metal is 5-15% (the seed).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

WORKLOAD_CONFIG_LABEL = "nvidia.com/gpu.workload.config"
VM_VGPU = "vm-vgpu"
VGPU_CONFIG_LABEL = "nvidia.com/vgpu.config"
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
    def compute_share(self) -> Fraction:
        """The time-sliced share of the GPU's compute each vGPU gets when all are busy."""
        return Fraction(1, self.max_per_gpu)


def _types(prefix: str, product: str, sizes: list[tuple[int, int]]) -> list[VgpuType]:
    return [VgpuType(f"{prefix}-{gb}C", product, gb if gb != 81 else 80, n) for gb, n in sizes]


# (framebuffer GB as the type name says it, vGPUs per GPU). H100 80GB: "80C" offers 81 GB in the table.
_H100 = [(80, 1), (40, 2), (20, 4), (16, 6), (10, 8), (8, 10), (5, 16), (4, 20)]
_A100_40 = [(40, 1), (20, 2), (10, 4), (8, 5), (5, 8), (4, 10)]
_A100_80 = [(80, 1), (40, 2), (20, 4), (16, 5), (10, 8), (8, 10), (4, 20)]

VGPU_TYPES: dict[str, VgpuType] = {
    t.name: t
    for t in [
        *_types("H100", "H100-80GB", _H100),  # H100 PCIe 80GB
        *_types("H100XM", "H100-80GB", _H100),  # H100 SXM5 80GB (HGX)
        *_types("A100", "A100-40GB", _A100_40),  # A100 PCIe 40GB
        *_types("A100D", "A100-80GB", _A100_80),  # A100 PCIe 80GB
    ]
}


def vgpu_type_for_resource(resource_name: str) -> VgpuType | None:
    """The vGPU type an extended resource advertises, or None (not a vGPU resource, or a type we do not know)."""
    if not resource_name.startswith(RESOURCE_PREFIX):
        return None
    return VGPU_TYPES.get(resource_name.removeprefix(RESOURCE_PREFIX))


def is_vgpu_node(labels: dict[str, str]) -> bool:
    return labels.get(WORKLOAD_CONFIG_LABEL) == VM_VGPU
