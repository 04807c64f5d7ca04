"""The MIG profile catalog: products, profiles and placements, from ../shared/reference/nvidia.md.

Pure data and lookups, no Django: the capacity app's data migration, the planner and the
simulator all read the same facts from here, so they can never disagree.

Placement = (start, size) in *memory slices* (nvml.h `nvmlGpuInstancePlacement_t`). A 7g instance
is {0}:8, not size 7. Values marked INFERRED in the reference are kept, with a comment.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache, cached_property

# NVML GPU-instance profile *index* constants (argument of nvmlDeviceGetGpuInstanceProfileInfo).
GI_INDEX_1_SLICE = 0
GI_INDEX_2_SLICE = 1
GI_INDEX_3_SLICE = 2
GI_INDEX_4_SLICE = 3
GI_INDEX_7_SLICE = 4
GI_INDEX_1_SLICE_REV1 = 7
GI_INDEX_2_SLICE_REV1 = 8
GI_INDEX_1_SLICE_REV2 = 9

# Compute-instance profile ids equal the NVML CI enum.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile of one product, e.g. H100-80GB 3g.40gb."""

    name: str  # as mig-parted's mig-devices spells it: "1g.10gb+me"
    profile_id: int  # info.id, what Create/PossiblePlacements take
    nvml_index: int  # NVML_GPU_INSTANCE_PROFILE_* constant
    compute_slices: int
    memory_slices: int
    memory_mib: int
    multiprocessors: int
    max_instances: int
    starts: tuple[int, ...]  # valid placement starts (memory-slice index)
    copy_engines: int = 1
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0

    @property
    def has_media_extensions(self) -> bool:
        return self.name.endswith("+me")

    @property
    def resource_suffix(self) -> str:
        """Kubernetes resource / mig-parted config-name form: "+" becomes "."."""
        return self.name.replace("+", ".")

    @property
    def resource_name(self) -> str:
        return f"nvidia.com/mig-{self.resource_suffix}"

    @property
    def placements(self) -> tuple[tuple[int, int], ...]:
        return tuple((s, self.memory_slices) for s in self.starts)

    @property
    def shape(self) -> str:
        """The seed's profile category: 1G, 2G, 3G, 4G or 7G."""
        return f"{self.compute_slices}G"


@dataclass(frozen=True)
class Product:
    """A MIG-capable GPU model."""

    key: str  # catalog key: "H100-80GB"
    model_name: str  # nvmlDeviceGetName: "NVIDIA H100 80GB HBM3"
    pci_device_id: int  # 0x2330 (device); NVML pciDeviceId = device << 16 | 0x10DE
    memory_mib: int  # nvmlDeviceGetMemoryInfo total, MiB
    multiprocessors: int
    compute_slices: int
    memory_slices: int
    max_gpu_instances: int
    compute_major: int
    compute_minor: int
    architecture: int  # NVML_DEVICE_ARCH_*: AMPERE=7, HOPPER=9
    power_limit_w: int
    profiles: tuple[Profile, ...] = field(default_factory=tuple)

    @property
    def gfd_product(self) -> str:
        """The value GPU Feature Discovery writes into nvidia.com/gpu.product."""
        keep = "".join(c for c in self.model_name if c.isalnum() or c in "-_. ")
        return keep.replace(" ", "-")

    @property
    def family(self) -> str:
        if self.compute_major >= 10:
            return "blackwell"
        if self.compute_major == 9:
            return "hopper"
        return "ampere"

    @property
    def pci_id_hex(self) -> str:
        """mig-parted device-filter form, e.g. 0x233010DE."""
        return f"0x{self.pci_device_id:04X}10DE"

    @cached_property
    def by_name(self) -> dict[str, Profile]:
        return {p.name: p for p in self.profiles}

    @cached_property
    def by_id(self) -> dict[int, Profile]:
        return {p.profile_id: p for p in self.profiles}

    def profile(self, name: str) -> Profile:
        """Look a profile up by "3g.40gb", "1g.10gb+me" or the resource form "1g.10gb.me"."""
        found = self.by_name.get(name) or self.by_name.get(_plus_form(name))
        if found is None:
            known = ", ".join(p.name for p in self.profiles)
            raise KeyError(f"{self.key} has no MIG profile {name!r}; known: {known}")
        return found


def _plus_form(name: str) -> str:
    return name[: -len(".me")] + "+me" if name.endswith(".me") else name


def _p(name, pid, idx, c, m, mib, sm, mx, starts, ce=1, dec=0, enc=0, jpeg=0, ofa=0) -> Profile:
    return Profile(name, pid, idx, c, m, mib, sm, mx, tuple(starts), ce, dec, enc, jpeg, ofa)


_SEVEN = range(7)

# Profile tables, each shared by the boards NVIDIA gives the same MIG geometry (reference §1.3, §1.4).
# A100 40GB: MIG guide table 6 + real captures; memorySizeMB from the go-nvml A100 mock (4.75/9.62/19.50/39.25 GiB).
_A100_40GB = (
    _p("1g.5gb", 19, GI_INDEX_1_SLICE, 1, 1, 4864, 14, 7, _SEVEN, ce=1),
    _p("1g.5gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 4864, 14, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
    _p("1g.10gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 9856, 14, 4, (0, 2, 4, 6), ce=1, dec=1),
    _p("2g.10gb", 14, GI_INDEX_2_SLICE, 2, 2, 9856, 28, 3, (0, 2, 4), ce=2, dec=1),
    _p("3g.20gb", 9, GI_INDEX_3_SLICE, 3, 4, 19968, 42, 2, (0, 4), ce=3, dec=2),
    _p("4g.20gb", 5, GI_INDEX_4_SLICE, 4, 4, 19968, 56, 1, (0,), ce=4, dec=2),
    _p("7g.40gb", 0, GI_INDEX_7_SLICE, 7, 8, 40192, 98, 1, (0,), ce=7, dec=5, jpeg=1, ofa=1),
)
# A100 80GB (SXM4 and PCIe share the guide's table): 1g.10gb 9728 and 2g.20gb 19968 MiB as GFD reported them on an
# A100 80GB PCIe; 3g/4g 39.25 GiB, 7g 79.00-79.25 GiB per the guide; 1g.20gb exact GiB NOT confirmed (§8).
_A100_80GB = (
    _p("1g.10gb", 19, GI_INDEX_1_SLICE, 1, 1, 9728, 14, 7, _SEVEN, ce=1),
    _p("1g.10gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 9728, 14, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
    _p("1g.20gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 19968, 14, 4, (0, 2, 4, 6), ce=1, dec=1),
    _p("2g.20gb", 14, GI_INDEX_2_SLICE, 2, 2, 19968, 28, 3, (0, 2, 4), ce=2, dec=1),
    _p("3g.40gb", 9, GI_INDEX_3_SLICE, 3, 4, 40192, 42, 2, (0, 4), ce=3, dec=2),
    _p("4g.40gb", 5, GI_INDEX_4_SLICE, 4, 4, 40192, 56, 1, (0,), ce=4, dec=2),
    _p("7g.80gb", 0, GI_INDEX_7_SLICE, 7, 8, 80896, 98, 1, (0,), ce=7, dec=5, jpeg=1, ofa=1),
)
# A30 24GB: real capture + MIG guide (reference §1.4); 5.81 / 11.69 / 23.44-23.50 GiB.
_A30 = (
    _p("1g.6gb", 14, GI_INDEX_1_SLICE, 1, 1, 5952, 14, 4, range(4), ce=1, dec=1),
    _p("1g.6gb+me", 21, GI_INDEX_1_SLICE_REV1, 1, 1, 5952, 14, 1, range(4), ce=1, dec=1, jpeg=1, ofa=1),
    _p("2g.12gb", 5, GI_INDEX_2_SLICE, 2, 2, 11968, 28, 2, (0, 2), ce=2, dec=2),
    _p("2g.12gb+me", 6, GI_INDEX_2_SLICE_REV1, 2, 2, 11968, 28, 1, (0, 2), ce=2, dec=2, jpeg=1, ofa=1),
    _p("4g.24gb", 0, GI_INDEX_4_SLICE, 4, 4, 24064, 56, 1, (0,), ce=4, dec=4, jpeg=1, ofa=1),
)
# H100 80GB HBM3 (SXM5): real capture (driver 5xx) + MIG guide table 7; MiB as nvidia-smi and GFD printed them.
_H100_80GB = (
    _p("1g.10gb", 19, GI_INDEX_1_SLICE, 1, 1, 9984, 16, 7, _SEVEN, ce=1, dec=1, jpeg=1),
    _p("1g.10gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 9984, 16, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
    _p("1g.20gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 20096, 26, 4, (0, 2, 4, 6), ce=1, dec=1, jpeg=1),
    _p("2g.20gb", 14, GI_INDEX_2_SLICE, 2, 2, 20096, 32, 3, (0, 2, 4), ce=2, dec=2, jpeg=2),
    _p("3g.40gb", 9, GI_INDEX_3_SLICE, 3, 4, 40448, 60, 2, (0, 4), ce=3, dec=3, jpeg=3),
    _p("4g.40gb", 5, GI_INDEX_4_SLICE, 4, 4, 40448, 64, 1, (0,), ce=4, dec=4, jpeg=4),
    _p("7g.80gb", 0, GI_INDEX_7_SLICE, 7, 8, 81152, 132, 1, (0,), ce=8, dec=7, jpeg=7, ofa=1),
)
# H100 PCIe (114 SMs): same profile names and counts as H100 80GB (NVIDIA vGPU docs "Hopper Architecture vGPU
# Types", "NVIDIA H100 PCIe 80GB" MIG-backed table; mig-parted groups the two), ids and placements the 7-slice
# scheme, memory taken from H100 80GB. Per-profile SM counts are NOT confirmed (no public -lgip of an H100 PCIe was
# found): INFERRED here as H100 80GB's scaled by 114/132 to the nearest even count, 7g = the whole 114.
_H100_PCIE = tuple(
    replace(p, multiprocessors=sm) for p, sm in zip(_H100_80GB, (14, 14, 22, 28, 52, 56, 114), strict=True)
)
# H100 NVL 94GB: real `nvidia-smi mig -lgip` capture (Azure NC40ads_H100_v5, driver 560): 10.75 / 21.62 / 46.38 /
# 93.12 GiB and SMs 16/16/26/32/60/64/132; MiB from the MIG device totals seen (11008, 22144, 47488; 7g = 93.125 GiB).
# Engines as H100 80GB (reference §1.4 "Engines as H100 80GB"); placements printed = §1.3.
_H100_NVL = (
    _p("1g.12gb", 19, GI_INDEX_1_SLICE, 1, 1, 11008, 16, 7, _SEVEN, ce=1, dec=1, jpeg=1),
    _p("1g.12gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 11008, 16, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
    _p("1g.24gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 22144, 26, 4, (0, 2, 4, 6), ce=1, dec=1, jpeg=1),
    _p("2g.24gb", 14, GI_INDEX_2_SLICE, 2, 2, 22144, 32, 3, (0, 2, 4), ce=2, dec=2, jpeg=2),
    _p("3g.47gb", 9, GI_INDEX_3_SLICE, 3, 4, 47488, 60, 2, (0, 4), ce=3, dec=3, jpeg=3),
    _p("4g.47gb", 5, GI_INDEX_4_SLICE, 4, 4, 47488, 64, 1, (0,), ce=4, dec=4, jpeg=4),
    _p("7g.94gb", 0, GI_INDEX_7_SLICE, 7, 8, 95360, 132, 1, (0,), ce=8, dec=7, jpeg=7, ofa=1),
)
# H200 141GB. Names, counts, memory/SM fractions and engines: MIG guide table 8 ("GPU Instance Profiles on H200").
# Real `-lgip` capture: ids 19/20/14/0, 1g.18gb 16.00 GiB (16384) 16 SMs, 2g.35gb 32.50 GiB (33280) 32 SMs,
# 7g.141gb 140.00 GiB (143360) 132 SMs. 3g.71gb: 74,893,492,224 bytes = 71424 MiB (69.75 GiB) and 60 SMs, Nsight
# Systems TARGET_INFO_GPU.totalMemory/smCount on a real H200 MIG 3g.71gb (driver 580.126.09), and PyTorch's
# round(total_memory / 2**30, 1) = 69.8 there; CUDA reports a MIG device's memory exactly as -lgip does (2g.35gb:
# 32.5 GiB, both). Sources: docs/simcluster.md "MIG catalog products". NOT confirmed (no public -lgip row found):
# ids 15/9/5 (the scheme of every 7-slice board); 4g.71gb memory = 3g.71gb's (same 4 memory slices, equal on every
# board's -lgip) and 64 SMs (users report); 1g.35gb memory = 2g.35gb's (same 2 memory slices, equal on every board)
# and 26 SMs (every Hopper 1g with 2 memory slices).
_H200 = (
    _p("1g.18gb", 19, GI_INDEX_1_SLICE, 1, 1, 16384, 16, 7, _SEVEN, ce=1, dec=1, jpeg=1),
    _p("1g.18gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 16384, 16, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
    _p("1g.35gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 33280, 26, 4, (0, 2, 4, 6), ce=1, dec=1, jpeg=1),
    _p("2g.35gb", 14, GI_INDEX_2_SLICE, 2, 2, 33280, 32, 3, (0, 2, 4), ce=2, dec=2, jpeg=2),
    _p("3g.71gb", 9, GI_INDEX_3_SLICE, 3, 4, 71424, 60, 2, (0, 4), ce=3, dec=3, jpeg=3),
    _p("4g.71gb", 5, GI_INDEX_4_SLICE, 4, 4, 71424, 64, 1, (0,), ce=4, dec=4, jpeg=4),
    _p("7g.141gb", 0, GI_INDEX_7_SLICE, 7, 8, 143360, 132, 1, (0,), ce=8, dec=7, jpeg=7, ofa=1),
)

# Product(key, NVML name, PCI device id, total MiB, SMs, compute slices, memory slices, max GIs, compute major, minor,
# NVML architecture, power limit W, profiles). Names are what nvmlDeviceGetName returns, so gfd_product is exactly
# the nvidia.com/gpu.product label GFD writes (reference §5: drop chars outside [A-Za-z0-9-_. ], spaces -> "-").
PRODUCTS: dict[str, Product] = {
    p.key: p
    for p in (
        Product("A100-40GB", "NVIDIA A100-SXM4-40GB", 0x20B0, 40960, 108, 7, 8, 7, 8, 0, 7, 400, _A100_40GB),
        # A100 PCIe 40GB: name and PCI id 0x20F1 from reference §1.4 (same table as SXM4); 250 W is the board's TDP
        # (datasheet), not in the reference.
        Product("A100-40GB-PCIE", "NVIDIA A100-PCIE-40GB", 0x20F1, 40960, 108, 7, 8, 7, 8, 0, 7, 250, _A100_40GB),
        Product("A100-80GB", "NVIDIA A100-SXM4-80GB", 0x20B2, 81920, 108, 7, 8, 7, 8, 0, 7, 400, _A100_80GB),
        # A100 80GB PCIe: name and PCI id 0x20B5 from reference §1.4; 300 W TDP (datasheet, not in the reference).
        Product("A100-80GB-PCIE", "NVIDIA A100 80GB PCIe", 0x20B5, 81920, 108, 7, 8, 7, 8, 0, 7, 300, _A100_80GB),
        # A30 24GB: 0x20B7, real capture + guide (reference §1.4).
        Product("A30-24GB", "NVIDIA A30", 0x20B7, 24576, 56, 4, 4, 4, 8, 0, 7, 165, _A30),
        # H100 80GB HBM3: 0x2330, 81559 MiB, 132 SMs, 700 W (reference §1.4).
        Product("H100-80GB", "NVIDIA H100 80GB HBM3", 0x2330, 81559, 132, 7, 8, 7, 9, 0, 9, 700, _H100_80GB),
        # H100 PCIe: name, 0x2331 and 114 SMs from reference §1.4; total 81559 MiB INFERRED (as SXM5, 80 GB);
        # 350 W TDP (datasheet, not in the reference).
        Product("H100-80GB-PCIE", "NVIDIA H100 PCIe", 0x2331, 81559, 114, 7, 8, 7, 9, 0, 9, 350, _H100_PCIE),
        # H100 NVL: 0x2321, 95830 MiB, 400 W (reference §1.4, real capture); 132 SMs = its 7g profile.
        Product("H100-94GB-NVL", "NVIDIA H100 NVL", 0x2321, 95830, 132, 7, 8, 7, 9, 0, 9, 400, _H100_NVL),
        # H200 SXM: 0x2335, 143771 MiB, 700 W (reference §1.4).
        Product("H200-141GB", "NVIDIA H200", 0x2335, 143771, 132, 7, 8, 7, 9, 0, 9, 700, _H200),
        # H200 NVL: name, 0x233B and 600 W from reference §1.4; 143771 MiB and the 600 W cap as `nvidia-smi` shows
        # them on a real H200 NVL (driver 580.173.02). Its MIG profiles (names, counts, slices) are H200 SXM's: NVIDIA
        # vGPU docs "Hopper Architecture vGPU Types", table "MIG-Backed NVIDIA vGPU for Compute for NVIDIA H200 PCIe
        # 141GB (H200 NVL)" lists the same seven profiles and counts as for "H200 SXM5 141GB". Per-profile MiB/SMs
        # are H200 SXM's (same GH100 and 141 GB); no H200 NVL -lgip capture was found.
        Product("H200-141GB-NVL", "NVIDIA H200 NVL", 0x233B, 143771, 132, 7, 8, 7, 9, 0, 9, 600, _H200),
    )
}

_BY_ALIAS: dict[str, Product] = {}
for _product in PRODUCTS.values():
    for _alias in (_product.key, _product.model_name, _product.gfd_product):
        _BY_ALIAS[_alias.lower()] = _product


def get_product(name: str) -> Product:
    """Resolve a catalog key ("H100-80GB"), an NVML name or a GFD product label value.

    A GFD MIG-strategy-single product ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb") or a shared
    product ("...-SHARED") resolves to its parent GPU.
    """
    key = name.strip().lower()
    for suffix in ("-shared",):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    if "-mig-" in key:
        key = key.split("-mig-")[0]
    try:
        return _BY_ALIAS[key]
    except KeyError:
        known = ", ".join(PRODUCTS)
        raise KeyError(f"unknown GPU product {name!r}; known: {known} (or their GFD product names)") from None


@cache  # inventories ask for every GPU's NVML name: a handful of names, 100,000 GPUs
def find_product(name: str) -> Product | None:
    """Like get_product, but None for GPUs without MIG (or unknown to the catalog)."""
    try:
        return get_product(name)
    except KeyError:
        return None


def named_configs(product: Product) -> dict[str, dict[str, int] | None]:
    """The GPU Operator's shipped configs for one product: name -> mig-devices (None = MIG off).

    all-disabled, all-enabled (MIG on, no instances), all-<profile> at its max count, and
    all-balanced (2 x 1-slice + 1 x 2-slice + 1 x 3-slice, or 2 x 1g + 1 x 2g on A30).
    """
    configs: dict[str, dict[str, int] | None] = {"all-disabled": None, "all-enabled": {}}
    for p in product.profiles:
        configs[f"all-{p.resource_suffix}"] = {p.name: p.max_instances}
    one = next(p for p in product.profiles if p.compute_slices == p.memory_slices == 1 and not p.has_media_extensions)
    two = next(p for p in product.profiles if p.compute_slices == 2 and not p.has_media_extensions)
    balanced = {one.name: 2, two.name: 1}
    three = next((p for p in product.profiles if p.compute_slices == 3), None)
    if three is not None:
        balanced[three.name] = 1
    configs["all-balanced"] = balanced
    return configs


def mig_parted_entries() -> dict[str, list[dict]]:
    """Every product's named configs as mig-parted v1 `mig-configs` entries (the shipped ConfigMap's shape).

    Products sharing a config name with identical mig-devices share one entry whose device-filter lists
    their PCI ids, as NVIDIA's own default-mig-parted-config does. Used by gpuaas's ConfigMap writer and
    by the simulator's GPU Operator, so both speak of the same configs.
    """
    configs: dict[str, list[dict]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    grouped: dict[str, dict[tuple, list[str]]] = {}
    for product in PRODUCTS.values():
        for name, devices in named_configs(product).items():
            if name in ("all-disabled", "all-enabled"):
                continue
            key = tuple(sorted((devices or {}).items()))
            grouped.setdefault(name, {}).setdefault(key, []).append(product.pci_id_hex)
    for name in sorted(grouped):
        configs[name] = [
            {"device-filter": filters, "devices": "all", "mig-enabled": True, "mig-devices": dict(devices)}
            for devices, filters in grouped[name].items()
        ]
    return configs
