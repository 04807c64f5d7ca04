"""Project, its guardian permission tables and ApiToken now live in tenancy (tenancy.0001).

State only: the foreign keys of pools name tenancy.Project, and the moved models leave pools' state;
their tables stay as they are (tenancy's models keep the `pools_` table names). Runs after the other
apps re-pointed their foreign keys, so no state ever references a model that is gone.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0004_pool_provisioning_lease_and_reconcile"),
        ("tenancy", "0001_initial"),
        ("billing", "0006_project_in_tenancy"),
        ("capacity", "0009_project_in_tenancy"),
        ("monitoring", "0004_project_in_tenancy"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="poolrequest",
                    name="project",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="requests", to="tenancy.project"),
                ),
                migrations.AlterField(
                    model_name="gpupool",
                    name="project",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="pools", to="tenancy.project"),
                ),
                migrations.AlterField(
                    model_name="allocation",
                    name="project",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="allocations", to="tenancy.project"),
                ),
                migrations.DeleteModel(name="ProjectUserObjectPermission"),
                migrations.DeleteModel(name="ProjectGroupObjectPermission"),
                migrations.DeleteModel(name="ApiToken"),
                migrations.DeleteModel(name="Project"),
            ],
        ),
    ]
