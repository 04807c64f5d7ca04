from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _load_catalog(sender, using="default", **kwargs):
    """Reference data, like content types: after migrate and after a (test) flush."""
    from .models import MigPlacement, MigProfile  # cycle: apps.py loads before the models registry is ready
    from .services.catalog import load_catalog  # cycle: the same (it imports the models)

    load_catalog(MigProfile, MigPlacement, using=using)


class CapacityConfig(AppConfig):
    name = "capacity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        post_migrate.connect(_load_catalog, sender=self, dispatch_uid="capacity-load-mig-catalog")
