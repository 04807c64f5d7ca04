"""Project moved to tenancy (tenancy.0001): the foreign key now names tenancy.Project. State only:
the column and its constraint already point at the same table, `pools_project`."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitoring", "0003_sample_key_time_first"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="shareviolation",
                    name="project",
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="tenancy.project"),
                ),
            ],
        ),
    ]
