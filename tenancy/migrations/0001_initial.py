"""Project, its guardian permission tables and ApiToken move here from pools, tables untouched.

State only: the tables (`pools_project`, ...) were created by pools.0001 and keep their names
(db_table). The content types move with the models (app_label pools -> tenancy), so existing
Permission rows, the guardian object permissions that point at them and the Operators group keep
working on an upgraded database. On a fresh database there are no content types yet (they are
created after migrate), so the rename finds nothing.
"""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED = ("project", "apitoken", "projectuserobjectpermission", "projectgroupobjectpermission")


def move_content_types(from_label: str, to_label: str):
    def move(apps, schema_editor):
        content_type = apps.get_model("contenttypes", "ContentType")
        db = schema_editor.connection.alias
        taken = set(
            content_type.objects.using(db).filter(app_label=to_label, model__in=MOVED).values_list("model", flat=True)
        )
        # A model whose new content type exists already (a half-done earlier run) keeps it: renaming
        # would break the unique (app_label, model) pair.
        content_type.objects.using(db).filter(app_label=from_label, model__in=set(MOVED) - taken).update(
            app_label=to_label
        )

    return move


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("pools", "0004_pool_provisioning_lease_and_reconcile"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Project",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(max_length=200)),
                        ("slug", models.SlugField(max_length=63, unique=True)),
                        (
                            "namespace",
                            models.CharField(
                                max_length=63,
                                unique=True,
                                validators=[
                                    django.core.validators.RegexValidator(
                                        "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                        "Lower-case letters, digits and '-' (a DNS label).",
                                    )
                                ],
                            ),
                        ),
                        ("cost_centre", models.CharField(blank=True, max_length=64)),
                        ("description", models.TextField(blank=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "db_table": "pools_project",
                        "ordering": ["slug"],
                        "permissions": [
                            ("manage_members", "Can manage project members"),
                            ("request_capacity", "Can request GPU capacity"),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="ApiToken",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(max_length=100)),
                        (
                            "key_prefix",
                            models.CharField(help_text="First characters of the key, to recognise it.", max_length=12),
                        ),
                        ("key_digest", models.CharField(max_length=64, unique=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("expires_at", models.DateTimeField(blank=True, null=True)),
                        ("last_used_at", models.DateTimeField(blank=True, null=True)),
                        ("revoked_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="api_tokens",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={"db_table": "pools_apitoken", "ordering": ["user_id", "-created_at"]},
                ),
                migrations.CreateModel(
                    name="ProjectGroupObjectPermission",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        (
                            "content_object",
                            models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.project"),
                        ),
                        ("group", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="auth.group")),
                        (
                            "permission",
                            models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="auth.permission"),
                        ),
                    ],
                    options={
                        "db_table": "pools_projectgroupobjectpermission",
                        "abstract": False,
                        "unique_together": {("group", "permission", "content_object")},
                    },
                ),
                migrations.CreateModel(
                    name="ProjectUserObjectPermission",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        (
                            "content_object",
                            models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="tenancy.project"),
                        ),
                        (
                            "permission",
                            models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="auth.permission"),
                        ),
                        ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        "db_table": "pools_projectuserobjectpermission",
                        "abstract": False,
                        "unique_together": {("user", "permission", "content_object")},
                    },
                ),
            ],
        ),
        migrations.RunPython(move_content_types("pools", "tenancy"), move_content_types("tenancy", "pools")),
    ]
