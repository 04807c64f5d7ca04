"""Load the MIG profile catalog (capacity/mig/catalog.py, from ../shared/reference/nvidia.md)."""

from django.db import migrations


def load_catalog(apps, schema_editor):
    from capacity.mig.catalog import PRODUCTS

    MigProfile = apps.get_model("capacity", "MigProfile")
    MigPlacement = apps.get_model("capacity", "MigPlacement")
    for product in PRODUCTS.values():
        for p in product.profiles:
            row, _ = MigProfile.objects.update_or_create(
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
            for start in p.starts:
                MigPlacement.objects.update_or_create(profile=row, start=start, defaults={"size": p.memory_slices})


class Migration(migrations.Migration):
    dependencies = [("capacity", "0002_initial")]

    operations = [migrations.RunPython(load_catalog, migrations.RunPython.noop)]
