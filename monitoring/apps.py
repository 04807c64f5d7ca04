from django.apps import AppConfig

from capacity.signals import workloads_attributed


class MonitoringConfig(AppConfig):
    name = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .tasks import queue_trespass_check  # cycle: app loading; models can be imported once it is ready

        workloads_attributed.connect(queue_trespass_check, dispatch_uid="monitoring.trespass_on_attribution")
