"""Every tier gets its TierProfilePolicy row: the built-in defaults (capacity.models.tiers.DEFAULT_POLICIES),
written as rows the admin shows and edits. A tier that already has a row keeps it."""

from django.db import migrations, models


def write_defaults(apps, schema_editor):
    from capacity.models.tiers import BUILT_IN_NOTE, DEFAULT_POLICIES

    TierProfilePolicy = apps.get_model("capacity", "TierProfilePolicy")
    for tier, policy in DEFAULT_POLICIES.items():
        TierProfilePolicy.objects.get_or_create(
            tier=tier,
            defaults={
                "min_compute_slices": policy.min_compute_slices,
                "max_compute_slices": policy.max_compute_slices,
                "notes": BUILT_IN_NOTE,
            },
        )


class Migration(migrations.Migration):
    dependencies = [
        ("capacity", "0019_gpu_pcie_and_numa_groups"),
    ]

    operations = [
        migrations.AlterField(
            model_name="tierprofilepolicy",
            name="tier",
            field=models.CharField(
                blank=True,
                choices=[
                    ("1", "Tier 1: MIG, SLA inference"),
                    ("2", "Tier 2: MIG/vGPU, staging"),
                    ("3", "Tier 3: time-slicing, development"),
                    ("full", "Full GPUs, training"),
                    ("", "Untiered"),
                ],
                max_length=8,
                unique=True,
            ),
        ),
        migrations.RunPython(write_defaults, migrations.RunPython.noop),
    ]
