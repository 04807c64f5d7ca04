"""Load the MIG profile catalog (capacity/mig/catalog.py, from ../shared/reference/nvidia.md)."""

from django.db import migrations


def load_catalog(apps, schema_editor):
    from capacity.services.catalog import load_catalog as load

    load(apps.get_model("capacity", "MigProfile"), apps.get_model("capacity", "MigPlacement"),
         using=schema_editor.connection.alias)


class Migration(migrations.Migration):
    dependencies = [("capacity", "0002_initial")]

    operations = [migrations.RunPython(load_catalog, migrations.RunPython.noop)]
