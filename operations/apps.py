from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """Workflows that span capacity and pools: MIG reconfiguration, take-offline checks, rebalancing.

    It writes capacity's reconfiguration and drain tables and asks pools' services to move allocations;
    its own rows are the rolling driver upgrades (operations.models), which only it and the dashboard read.
    capacity and pools never import it.
    """

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from capacity import signals as capacity_signals  # cycle: app loading; receivers import models

        from . import receivers  # cycle: the same

        capacity_signals.mig_result_reported.connect(receivers.record_mig_result, dispatch_uid="operations.mig")
