"""How the simulated GPUs of a node are wired: NVLink per product, and a PCIe/NUMA tree.

The fake NVML (simcluster.nvml) answers nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo_v2,
nvmlDeviceGetNvLinkRemoteDeviceType, nvmlDeviceGetP2PStatus and nvmlDeviceGetTopologyCommonAncestor from
here. Facts and their sources: docs/tiers.md, "Topology facts".

NVLink, per product:
- HGX boards (SXM) join all 8 GPUs through NVSwitch chips; every NVLink of a GPU ends on a switch, so
  nvmlDeviceGetNvLinkRemotePciInfo_v2 names the switch's PCI address, never a peer GPU's (as on a real
  A100 SXM4: "Link 0: Remote Device 00000008:00:00.0"). H100/H200 SXM: 18 fourth-generation links to 4
  NVSwitches; A100 SXM4: 12 third-generation links to 6 NVSwitches.
- PCIe cards are joined in pairs (0-1, 2-3, ...) by NVLink bridges: each link's remote is the partner GPU.
  H100 PCIe and H100 NVL: 600 GB/s over the bridge (12 links of 50 GB/s); A100 PCIe: 12 links, 600 GB/s;
  H200 NVL: 18 links (2- or 4-way bridges; modelled as pairs); A30: 4 links (200 GB/s).

PCIe (simulator values, a generic two-socket server; real chassis differ): GPUs 2k and 2k+1 sit under one
PCIe switch (NVML_TOPOLOGY_SINGLE), the first half of a node's GPUs on NUMA node 0 and the rest on NUMA
node 1 (as DGX H100's `nvidia-smi topo -m` shows, GPUs 0-3 / 4-7); each switch hangs off its own host
bridge, so two GPUs of one socket under different switches meet at NVML_TOPOLOGY_NODE, and GPUs of
different sockets at NVML_TOPOLOGY_SYSTEM.
"""

from __future__ import annotations

from dataclasses import dataclass

# nvml.h values (pynvml carries the same; kept local as in simcluster.hardware).
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50


@dataclass(frozen=True, slots=True)
class Fabric:
    """One product's NVLink: links per GPU, and NVSwitch chips per board (0: bridged pairs)."""

    links: int
    nvswitches: int = 0


FABRICS = {
    "H100-80GB": Fabric(18, nvswitches=4),
    "H200-141GB": Fabric(18, nvswitches=4),
    "A100-40GB": Fabric(12, nvswitches=6),
    "A100-80GB": Fabric(12, nvswitches=6),
    "H100-80GB-PCIE": Fabric(12),
    "H100-94GB-NVL": Fabric(12),
    "H200-141GB-NVL": Fabric(18),
    "A100-40GB-PCIE": Fabric(12),
    "A100-80GB-PCIE": Fabric(12),
    "A30-24GB": Fabric(4),
}


def fabric(product: str) -> Fabric | None:
    return FABRICS.get(product)


def nvlink_remote(product: str, index: int, link: int, gpu_count: int) -> tuple[str, int] | None:
    """Where link `link` of GPU `index` ends: ("switch", n), ("gpu", peer index), or None (no such link,
    or a bridged GPU without a partner)."""
    board = FABRICS.get(product)
    if board is None or not 0 <= link < board.links:
        return None
    if board.nvswitches:
        return "switch", link * board.nvswitches // board.links
    peer = index ^ 1
    return ("gpu", peer) if peer < gpu_count else None


def nvswitch_bus_id(switch: int) -> str:
    """The PCI address NVML reports for NVSwitch `switch` of a board (a domain of its own, as on HGX A100)."""
    return f"{8 + switch:08X}:00:00.0"


def nvlink_domain(product: str, index: int) -> int | None:
    """The NVLink domain of GPU `index`: 0 for a whole NVSwitch board, its pair otherwise, None: no NVLink."""
    board = FABRICS.get(product)
    if board is None:
        return None
    return 0 if board.nvswitches else index // 2


def numa_node(index: int, gpu_count: int) -> int:
    return index * 2 // gpu_count if gpu_count > 1 else 0


def common_ancestor(a: int, b: int, gpu_count: int) -> int:
    """nvmlDeviceGetTopologyCommonAncestor between GPUs `a` and `b` of one node (see the module docstring)."""
    if a // 2 == b // 2:
        return NVML_TOPOLOGY_SINGLE
    if numa_node(a, gpu_count) == numa_node(b, gpu_count):
        return NVML_TOPOLOGY_NODE
    return NVML_TOPOLOGY_SYSTEM
