"""Allocation moved to capacity (capacity.0026): the foreign key names capacity.Allocation. State only: the
column and its constraint point at the same table, `pools_allocation`."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("capacity", "0026_allocation_beside_the_units"),
        ("monitoring", "0010_shareviolation_share_priority"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="idlereservation",
                    name="allocation",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="idle_flags", to="capacity.allocation"
                    ),
                ),
            ],
        ),
    ]
