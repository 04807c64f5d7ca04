"""Project moved to tenancy (tenancy.0001): the foreign key now names tenancy.Project. State only:
the column and its constraint already point at the same table, `pools_project`."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0005_billing_run_leases"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="statement",
                    name="project",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="statements", to="tenancy.project"),
                ),
                migrations.AlterField(
                    model_name="usagerecord",
                    name="project",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="usage_records", to="tenancy.project"),
                ),
            ],
        ),
    ]
