"""The MIG profile catalog: products, profiles and placements, from ../shared/reference/nvidia.md.

Pure data and lookups, no Django: the capacity app's data migration, the planner and the
simulator all read the same facts from here, so they can never disagree.

Placement = (start, size) in *memory slices* (nvml.h `nvmlGpuInstancePlacement_t`). A 7g instance
is {0}:8, not size 7. Values marked INFERRED in the reference are kept, with a comment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

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

PRODUCTS: dict[str, Product] = {
    p.key: p
    for p in (
        Product(
            "A100-40GB", "NVIDIA A100-SXM4-40GB", 0x20B0, 40960, 108, 7, 8, 7, 8, 0, 7, 400,
            (
                _p("1g.5gb", 19, GI_INDEX_1_SLICE, 1, 1, 4864, 14, 7, _SEVEN, ce=1),
                _p("1g.5gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 4864, 14, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
                _p("1g.10gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 9856, 14, 4, (0, 2, 4, 6), ce=1, dec=1),
                _p("2g.10gb", 14, GI_INDEX_2_SLICE, 2, 2, 9856, 28, 3, (0, 2, 4), ce=2, dec=1),
                _p("3g.20gb", 9, GI_INDEX_3_SLICE, 3, 4, 19968, 42, 2, (0, 4), ce=3, dec=2),
                _p("4g.20gb", 5, GI_INDEX_4_SLICE, 4, 4, 19968, 56, 1, (0,), ce=4, dec=2),
                _p("7g.40gb", 0, GI_INDEX_7_SLICE, 7, 8, 40192, 98, 1, (0,), ce=7, dec=5, jpeg=1, ofa=1),
            ),
        ),
        Product(
            "A100-80GB", "NVIDIA A100-SXM4-80GB", 0x20B2, 81920, 108, 7, 8, 7, 8, 0, 7, 400,
            (
                _p("1g.10gb", 19, GI_INDEX_1_SLICE, 1, 1, 9728, 14, 7, _SEVEN, ce=1),
                _p("1g.10gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 9728, 14, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
                _p("1g.20gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 19968, 14, 4, (0, 2, 4, 6), ce=1, dec=1),
                _p("2g.20gb", 14, GI_INDEX_2_SLICE, 2, 2, 19968, 28, 3, (0, 2, 4), ce=2, dec=1),
                _p("3g.40gb", 9, GI_INDEX_3_SLICE, 3, 4, 40192, 42, 2, (0, 4), ce=3, dec=2),
                _p("4g.40gb", 5, GI_INDEX_4_SLICE, 4, 4, 40192, 56, 1, (0,), ce=4, dec=2),
                _p("7g.80gb", 0, GI_INDEX_7_SLICE, 7, 8, 80896, 98, 1, (0,), ce=7, dec=5, jpeg=1, ofa=1),
            ),
        ),
        Product(
            "A30-24GB", "NVIDIA A30", 0x20B7, 24576, 56, 4, 4, 4, 8, 0, 7, 165,
            (
                _p("1g.6gb", 14, GI_INDEX_1_SLICE, 1, 1, 5952, 14, 4, range(4), ce=1, dec=1),
                _p("1g.6gb+me", 21, GI_INDEX_1_SLICE_REV1, 1, 1, 5952, 14, 1, range(4), ce=1, dec=1, jpeg=1, ofa=1),
                _p("2g.12gb", 5, GI_INDEX_2_SLICE, 2, 2, 11968, 28, 2, (0, 2), ce=2, dec=2),
                _p("2g.12gb+me", 6, GI_INDEX_2_SLICE_REV1, 2, 2, 11968, 28, 1, (0, 2), ce=2, dec=2, jpeg=1, ofa=1),
                _p("4g.24gb", 0, GI_INDEX_4_SLICE, 4, 4, 24064, 56, 1, (0,), ce=4, dec=4, jpeg=1, ofa=1),
            ),
        ),
        Product(
            "H100-80GB", "NVIDIA H100 80GB HBM3", 0x2330, 81559, 132, 7, 8, 7, 9, 0, 9, 700,
            (
                _p("1g.10gb", 19, GI_INDEX_1_SLICE, 1, 1, 9984, 16, 7, _SEVEN, ce=1, dec=1, jpeg=1),
                _p("1g.10gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 9984, 16, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
                _p("1g.20gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 20096, 26, 4, (0, 2, 4, 6), ce=1, dec=1, jpeg=1),
                _p("2g.20gb", 14, GI_INDEX_2_SLICE, 2, 2, 20096, 32, 3, (0, 2, 4), ce=2, dec=2, jpeg=2),
                _p("3g.40gb", 9, GI_INDEX_3_SLICE, 3, 4, 40448, 60, 2, (0, 4), ce=3, dec=3, jpeg=3),
                _p("4g.40gb", 5, GI_INDEX_4_SLICE, 4, 4, 40448, 64, 1, (0,), ce=4, dec=4, jpeg=4),
                _p("7g.80gb", 0, GI_INDEX_7_SLICE, 7, 8, 81152, 132, 1, (0,), ce=8, dec=7, jpeg=7, ofa=1),
            ),
        ),
        # H200: ids 19/20/14/0 confirmed; 15/9/5, 1g.35gb SMs and 1g.35gb/3g/4g MiB INFERRED (reference §1.4, §8).
        Product(
            "H200-141GB", "NVIDIA H200", 0x2335, 143771, 132, 7, 8, 7, 9, 0, 9, 700,
            (
                _p("1g.18gb", 19, GI_INDEX_1_SLICE, 1, 1, 16384, 16, 7, _SEVEN, ce=1, dec=1, jpeg=1),
                _p("1g.18gb+me", 20, GI_INDEX_1_SLICE_REV1, 1, 1, 16384, 16, 1, _SEVEN, ce=1, dec=1, jpeg=1, ofa=1),
                _p("1g.35gb", 15, GI_INDEX_1_SLICE_REV2, 1, 2, 33280, 26, 4, (0, 2, 4, 6), ce=1, dec=1, jpeg=1),
                _p("2g.35gb", 14, GI_INDEX_2_SLICE, 2, 2, 33280, 32, 3, (0, 2, 4), ce=2, dec=2, jpeg=2),
                _p("3g.71gb", 9, GI_INDEX_3_SLICE, 3, 4, 66560, 60, 2, (0, 4), ce=3, dec=3, jpeg=3),
                _p("4g.71gb", 5, GI_INDEX_4_SLICE, 4, 4, 66560, 64, 1, (0,), ce=4, dec=4, jpeg=4),
                _p("7g.141gb", 0, GI_INDEX_7_SLICE, 7, 8, 143360, 132, 1, (0,), ce=8, dec=7, jpeg=7, ofa=1),
            ),
        ),
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
