from django.apps import AppConfig


class PoolsConfig(AppConfig):
    name = "pools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from capacity.services import hooks  # cycle: app loading; services import models

        from .services import enqueue_queue_processing, rehome_allocations  # cycle: the same

        hooks.on_instances_gone(rehome_allocations)
        hooks.on_capacity_appeared(enqueue_queue_processing)
