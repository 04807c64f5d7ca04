"""The MIG catalog's rows (MigProfile, MigPlacement), kept equal to capacity/mig/catalog.py.

Run by the data migration (with historical models) and after every migrate or flush (post_migrate,
like Django's content types), so a database, a test flush included, never lacks the catalog.
"""

from __future__ import annotations

from capacity.mig.catalog import PRODUCTS


def load_catalog(MigProfile, MigPlacement, *, using: str = "default") -> int:  # noqa: N803 - model classes
    """Create or update every catalog profile and placement; returns rows written. Idempotent."""
    fields = (
        "product",
        "name",
        "profile_id",
        "compute_slices",
        "memory_slices",
        "memory_mib",
        "multiprocessors",
        "max_instances",
        "placements",
    )
    expected = sorted(
        (
            product.key,
            p.name,
            p.profile_id,
            p.compute_slices,
            p.memory_slices,
            p.memory_mib,
            p.multiprocessors,
            p.max_instances,
            tuple(p.starts),
        )
        for product in PRODUCTS.values()
        for p in product.profiles
    )
    placements = sum(len(p.starts) for product in PRODUCTS.values() for p in product.profiles)
    profiles = MigProfile.objects.using(using)
    # Compare values, not only counts, so a corrected catalog figure reaches existing databases at the next migrate.
    current = sorted((*row[:-1], tuple(row[-1] or ())) for row in profiles.values_list(*fields))
    if current == expected and MigPlacement.objects.using(using).count() == placements:
        return 0
    written = 0
    for product in PRODUCTS.values():
        for p in product.profiles:
            row, _ = profiles.update_or_create(
                product=product.key,
                name=p.name,
                defaults=dict(
                    profile_id=p.profile_id,
                    compute_slices=p.compute_slices,
                    memory_slices=p.memory_slices,
                    memory_mib=p.memory_mib,
                    multiprocessors=p.multiprocessors,
                    max_instances=p.max_instances,
                    placements=list(p.starts),
                ),
            )
            written += 1
            for start in p.starts:
                MigPlacement.objects.using(using).update_or_create(
                    profile=row, start=start, defaults={"size": p.memory_slices}
                )
                written += 1
    return written
