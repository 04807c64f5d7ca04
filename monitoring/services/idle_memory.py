"""The driver's own memory on an idle unit, learned per product and MIG profile from NVML polls.

A GPU (MIG off) or MIG device with no process in NVML's list still reads memory in use: what the driver
reserves for itself (an idle H100 80GB HBM3 reads about 455 MiB, an H200 about 700, a 1g.10gb MIG
device about 12; docs/simcluster.md lists recorded figures). That is no one's activity, so trespass
detection subtracts it (`baseline_mib`) before comparing with MONITORING_TRESPASS_MEM_MIB. The value
is learned, not configured: each poll records, per (product, profile), the lowest reading of a
process-free unit, so a driver upgrade that changes the reservation is followed at the next poll.
Demo seeding writes no processes: it learns nothing here (UnitSample.idle_kind stays None).
"""

from __future__ import annotations

from datetime import datetime

from monitoring.models import IdleMemory

Kind = tuple[str, str]  # (product, MIG profile name or "" for a whole GPU)


def learn_idle_memory(samples, *, at: datetime) -> int:
    """Record the idle reading of every unit kind seen process-free in `samples`; returns the kinds changed.

    One read and at most one write per kind that changed (a steady fleet writes nothing).
    """
    seen: dict[Kind, int] = {}
    for sample in samples:
        mem = sample.values.get("mem_used_mib")
        if sample.idle_kind is None or mem is None:
            continue
        seen[sample.idle_kind] = min(int(mem), seen.get(sample.idle_kind, int(mem)))
    if not seen:
        return 0
    products = sorted({product for product, _ in seen})
    known = {
        (row.product, row.profile_name): row.mem_used_mib for row in IdleMemory.objects.filter(product__in=products)
    }
    changed = [
        IdleMemory(product=p, profile_name=m, mem_used_mib=mib, learned_at=at)
        for (p, m), mib in sorted(seen.items())
        if known.get((p, m)) != mib
    ]
    if changed:
        IdleMemory.objects.bulk_create(
            changed,
            update_conflicts=True,
            unique_fields=["product", "profile_name"],
            update_fields=["mem_used_mib", "learned_at"],
        )
    return len(changed)


def baseline_mib() -> dict[Kind, int]:
    """Every learned idle reading, by (product, profile): one query."""
    return {(p, m): mib for p, m, mib in IdleMemory.objects.values_list("product", "profile_name", "mem_used_mib")}
