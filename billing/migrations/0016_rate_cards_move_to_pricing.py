"""RateCard and RateCardEntry now live in pricing (pricing.0001).

State only: the usage record's foreign key names pricing.RateCard, and the moved models leave
billing's state; their tables stay as they are (pricing's models keep the `billing_` table names),
so the column and its constraint already point at the right table.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0015_allocation_in_capacity"),
        ("pricing", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="usagerecord",
                    name="rate_card",
                    field=models.ForeignKey(
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="usage_records",
                        to="pricing.ratecard",
                    ),
                ),
                migrations.DeleteModel(name="RateCardEntry"),
                migrations.DeleteModel(name="RateCard"),
            ],
        ),
    ]
