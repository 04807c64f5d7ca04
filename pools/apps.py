from django.apps import AppConfig


class PoolsConfig(AppConfig):
    name = "pools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from capacity import signals as capacity_signals  # cycle: app loading; services import models

        from . import receivers  # cycle: the same

        capacity_signals.instances_gone.connect(receivers.rehome_gone_instances, dispatch_uid="pools.rehome")
        capacity_signals.capacity_appeared.connect(receivers.queue_pass_on_capacity, dispatch_uid="pools.queue")
