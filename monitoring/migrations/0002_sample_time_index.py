"""Time index of the sample table: BRIN on PostgreSQL (a few pages for billions of rows, since rows
arrive in time order), a plain btree on SQLite (the embedded demo). Rollups and retention scan by ts."""

from django.db import migrations

BRIN = "CREATE INDEX IF NOT EXISTS monitoring_sample_ts_brin ON monitoring_sample USING brin (ts) WITH (pages_per_range = 32)"
BTREE = "CREATE INDEX IF NOT EXISTS monitoring_sample_ts ON monitoring_sample (ts)"


def create(apps, schema_editor):
    schema_editor.execute(BRIN if schema_editor.connection.vendor == "postgresql" else BTREE)


def drop(apps, schema_editor):
    name = "monitoring_sample_ts_brin" if schema_editor.connection.vendor == "postgresql" else "monitoring_sample_ts"
    schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("monitoring", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
