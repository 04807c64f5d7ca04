"""What the fleet offers, as matching's Candidates: the catalog's MIG profiles, whole GPUs, time-slice
replicas and vGPU types, read from the nodes (fleet_candidates) or built for one product."""

from __future__ import annotations

from fractions import Fraction

from django.db.models import Count, Max, Q

from capacity.choices import SharingStrategy, SpecKind
from capacity.mig.catalog import PRODUCTS, Product, find_product
from capacity.models import GpuCapacity, SpecAndCount
from capacity.vgpu import VGPU_TYPES, VgpuType

from ..models import Allocation
from .matching import KIND_ORDER, MPS, VGPU, Candidate
from .specs import nominal_gb

# A session at most this long counts as short and interactive: shared tiers suit it whatever the workload.


def product_memory_gib(product: Product) -> Fraction:
    """A product's memory as teams read it: the number in the catalog key (H200-141GB: 141)."""
    digits = product.key.rsplit("-", 1)[-1].removesuffix("GB")
    return Fraction(int(digits)) if digits.isdigit() else Fraction(product.memory_mib, 1024)


def mig_candidates(product: Product) -> list[Candidate]:
    return [
        Candidate(
            SpecKind.MIG,
            product.key,
            Fraction(nominal_gb(profile)),
            Fraction(profile.compute_slices, product.compute_slices),
            profile_name=profile.name,
        )
        for profile in product.profiles
        if not profile.has_media_extensions
    ]


def full_candidate(product: str, memory_gib: Fraction, gpus_per_node: int) -> Candidate:
    return Candidate(SpecKind.FULL, product, memory_gib, Fraction(1), gpus_per_node=max(1, gpus_per_node))


def timeslice_candidate(product: str, memory_gib: Fraction, replicas: int, *, mps: bool = False) -> Candidate:
    kind = MPS if mps else SpecKind.TIMESLICE
    return Candidate(kind, product, memory_gib / replicas, Fraction(1, replicas), replicas=replicas)


def fleet_candidates(*, cluster_id: int | None = None) -> list[Candidate]:
    """The kinds of unit the fleet offers now (present GPUs, whatever their load), three small queries.

    With no GPU in the fleet yet, the catalog stands in (MIG profiles and whole GPUs of every product),
    so a request can be matched before discovery has run.
    """
    present = GpuCapacity.objects.present()
    if cluster_id is not None:
        present = present.filter(node__cluster_id=cluster_id)
    if not present.exists():
        out: list[Candidate] = []
        for product in PRODUCTS.values():
            out += mig_candidates(product)
            out.append(full_candidate(product.key, product_memory_gib(product), 8))
        return out
    out = []
    for key in sorted(set(present.filter(mig_mode_current=True).values_list("catalog_product", flat=True))):
        if key in PRODUCTS:
            out += mig_candidates(PRODUCTS[key])
    whole = present.filter(mig_mode_current=False)
    per_node = (
        whole.filter(node__timeslice_replicas__lte=1)
        .values("node_id", "catalog_product", "product")
        .annotate(n=Count("pk"), mib=Max("memory_mib"))
        .order_by()
    )
    full: dict[str, tuple[Fraction, int]] = {}
    for row in per_node:
        name = row["catalog_product"] or row["product"]
        memory = _memory(name, row["mib"])
        best = full.get(name, (memory, 0))
        full[name] = (memory, max(best[1], row["n"]))
    out += [full_candidate(name, memory, n) for name, (memory, n) in sorted(full.items())]
    shared = (
        whole.filter(Q(node__timeslice_replicas__gt=1))
        .values("catalog_product", "product", "node__timeslice_replicas", "node__sharing_strategy")
        .annotate(mib=Max("memory_mib"))
        .order_by()
    )
    seen = set()
    for row in shared:
        name = row["catalog_product"] or row["product"]
        mps = row["node__sharing_strategy"] == SharingStrategy.MPS
        key = (name, row["node__timeslice_replicas"], mps)
        if key not in seen:
            seen.add(key)
            memory = _memory(name, row["mib"])
            out.append(timeslice_candidate(name, memory, row["node__timeslice_replicas"], mps=mps))
    out += [vgpu_candidate(VGPU_TYPES[name]) for name in fleet_vgpu_types(cluster_id=cluster_id)]
    out.sort(key=lambda c: (KIND_ORDER.index(c.kind), c.product, c.replicas, c.profile_name))
    return out


def fleet_vgpu_types(*, cluster_id: int | None = None) -> list[str]:
    """The vGPU types discovery found on the fleet's present vm-vgpu nodes (sandbox device plugin resources)."""
    vgpus = SpecAndCount.objects.filter(kind=SpecKind.VGPU, node__gone_at__isnull=True)
    if cluster_id is not None:
        vgpus = vgpus.filter(node__cluster_id=cluster_id)
    return sorted(name for name in set(vgpus.values_list("profile_name", flat=True)) if name in VGPU_TYPES)


def vgpu_candidate(vgpu: VgpuType) -> Candidate:
    return Candidate(
        VGPU,
        vgpu.product,
        Fraction(vgpu.framebuffer_gb),
        vgpu.compute_share,
        profile_name=vgpu.name,
        replicas=vgpu.max_per_gpu,
    )


def _memory(name: str, memory_mib: int | None) -> Fraction:
    product = find_product(name)
    if product is not None:
        return product_memory_gib(product)
    return Fraction(memory_mib or 0, 1024)


def free_vgpus(vgpu_type: str, *, cluster_id: int | None = None) -> int:
    """vGPUs of a type the fleet's vm-vgpu nodes have allocatable now, less those pools hold."""
    rows = SpecAndCount.objects.filter(kind=SpecKind.VGPU, profile_name=vgpu_type, node__gone_at__isnull=True)
    held = Allocation.objects.active().filter(kind=SpecKind.VGPU, profile_name=vgpu_type)
    if cluster_id is not None:
        rows = rows.filter(node__cluster_id=cluster_id)
        held = held.filter(gpu__node__cluster_id=cluster_id)
    return max(0, sum(rows.values_list("allocatable", flat=True)) - held.count())
