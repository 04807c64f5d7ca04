"""Allocation now lives in capacity (capacity.0026), beside the units it holds. State only: the foreign keys
of pools name capacity.Allocation and the model leaves pools' state; its table stays as it is. Runs after
the other apps re-pointed their foreign keys, so no state ever references a model that is gone."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0015_allocation_in_capacity"),
        ("capacity", "0026_allocation_beside_the_units"),
        ("monitoring", "0011_allocation_in_capacity"),
        ("pools", "0021_share_priority_and_spec_kind_mps"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="loan",
                    name="allocation",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="loans", to="capacity.allocation"
                    ),
                ),
                migrations.AlterField(
                    model_name="eviction",
                    name="allocation",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="evictions",
                        to="capacity.allocation",
                    ),
                ),
                migrations.DeleteModel(
                    name="Allocation",
                ),
            ],
        ),
    ]
