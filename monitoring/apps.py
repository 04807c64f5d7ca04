from django.apps import AppConfig

from capacity.signals import workloads_attributed


class MonitoringConfig(AppConfig):
    name = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pools import cards  # cycle: app loading; models can be imported once the registry is ready

        from .cards import utilisation_expression  # cycle: the same (it imports monitoring's models)

        cards.register_utilisation(utilisation_expression)

        from .tasks import queue_trespass_check  # cycle: the same

        workloads_attributed.connect(queue_trespass_check, dispatch_uid="monitoring.trespass_on_attribution")
