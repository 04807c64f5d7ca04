"""PostgreSQL: extended ndistinct statistics on the columns a statement groups usage records by (#28).

Without them the planner multiplies each column's distinct values, expects about a group per ten
records, and sorts every record of the month (external merge on disk) instead of hashing the few
thousand groups: the month close took 3.8x its GROUP BY floor. ANALYZE fills them (here once, then autovacuum).
Nothing on SQLite.
"""

from django.db import migrations

COLUMNS = "project_id, pool_id, kind, product, profile_name, replicas, hourly_rate, rate_card_id"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE STATISTICS IF NOT EXISTS billing_usage_line_groups (ndistinct) ON {COLUMNS} FROM billing_usagerecord"
        )
        schema_editor.execute("ANALYZE billing_usagerecord")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP STATISTICS IF EXISTS billing_usage_line_groups")


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0012_rate_card_vgpu_licence"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
