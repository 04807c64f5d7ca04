"""Allocation (a held unit) moves here from pools, beside the units it holds: capacity's "free" is defined by
it. State only: the table keeps its name (`pools_allocation`, db_table), with its constraints and indexes. The
content type moves with the model (app_label pools -> capacity), so existing Permission rows (view_allocation,
...) and any group holding them keep working on an upgraded database; on a fresh one there are no content
types yet and the rename finds nothing (as tenancy.0001 did for Project)."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def move_content_type(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    if not content_type.objects.using(db).filter(app_label="capacity", model="allocation").exists():
        content_type.objects.using(db).filter(app_label="pools", model="allocation").update(app_label="capacity")


def move_content_type_back(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    if not content_type.objects.using(db).filter(app_label="pools", model="allocation").exists():
        content_type.objects.using(db).filter(app_label="capacity", model="allocation").update(app_label="pools")


class Migration(migrations.Migration):
    dependencies = [
        ("capacity", "0025_mps_client_limits"),
        ("pools", "0021_share_priority_and_spec_kind_mps"),
        ("tenancy", "0003_identity_groups"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Allocation",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("full", "Full GPU"),
                                    ("mig", "MIG instance"),
                                    ("timeslice", "Time-slice replica"),
                                    ("vgpu", "vGPU (virtual machines)"),
                                    ("mps", "MPS share"),
                                ],
                                max_length=16,
                            ),
                        ),
                        (
                            "replica",
                            models.PositiveSmallIntegerField(
                                default=0, help_text="Time-slice replica index; 0 otherwise."
                            ),
                        ),
                        ("resource_name", models.CharField(max_length=100)),
                        ("product", models.CharField(max_length=32)),
                        ("profile_name", models.CharField(blank=True, max_length=32)),
                        (
                            "compute_slices",
                            models.PositiveSmallIntegerField(default=7, help_text="Billing weight of the unit."),
                        ),
                        ("allocated_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("released_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "end_reason",
                            models.CharField(
                                blank=True,
                                editable=False,
                                help_text="Why the unit ended before its pool was released (its MIG instance was destroyed); the project's statement says so.",
                                max_length=300,
                            ),
                        ),
                        (
                            "vacated_at",
                            models.DateTimeField(
                                blank=True,
                                editable=False,
                                help_text="After the unit ended: when no pod of the project used it any more (the 'ending' state ends). Until then the unit is handed to no other project.",
                                null=True,
                            ),
                        ),
                        (
                            "ending_lease_expires_at",
                            models.DateTimeField(
                                blank=True,
                                editable=False,
                                help_text="While a sweep evicts the unit's pods: another sweep leaves it alone until this passes.",
                                null=True,
                            ),
                        ),
                        (
                            "gpu",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="allocations",
                                to="capacity.gpucapacity",
                            ),
                        ),
                        (
                            "mig_instance",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="allocations",
                                to="capacity.miginstance",
                            ),
                        ),
                        (
                            "pool",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="allocations",
                                to="pools.gpupool",
                            ),
                        ),
                        (
                            "project",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="allocations",
                                to="tenancy.project",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "pools_allocation",
                        "ordering": ["pool_id", "id"],
                        "indexes": [
                            models.Index(fields=["project", "released_at"], name="pools_alloc_project_active"),
                            models.Index(
                                condition=models.Q(("released_at__isnull", False), ("vacated_at__isnull", True)),
                                fields=["released_at"],
                                name="pools_alloc_ending",
                            ),
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                condition=models.Q(("mig_instance__isnull", False), ("released_at__isnull", True)),
                                fields=("mig_instance",),
                                name="pools_allocation_unique_active_mig_instance",
                            ),
                            models.UniqueConstraint(
                                condition=models.Q(("mig_instance__isnull", True), ("released_at__isnull", True)),
                                fields=("gpu", "replica"),
                                name="pools_allocation_unique_active_gpu_replica",
                            ),
                            models.CheckConstraint(
                                condition=models.Q(
                                    models.Q(("kind", "mig"), _negated=True),
                                    ("mig_instance__isnull", False),
                                    _connector="OR",
                                ),
                                name="pools_allocation_mig_has_instance",
                            ),
                        ],
                    },
                ),
            ],
        ),
        migrations.RunPython(move_content_type, move_content_type_back),
    ]
