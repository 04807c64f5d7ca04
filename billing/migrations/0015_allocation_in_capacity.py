"""Allocation moved to capacity (capacity.0026): the foreign key names capacity.Allocation. State only: the
column and its constraint point at the same table, `pools_allocation`."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0014_spec_kind_mps"),
        ("capacity", "0026_allocation_beside_the_units"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="usagerecord",
                    name="allocation",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="usage_records",
                        to="capacity.allocation",
                    ),
                ),
            ],
        ),
    ]
