from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pools import signals as pools_signals  # cycle: app loading; receivers import the queue's models

        from . import receivers  # cycle: the same

        pools_signals.queue_pass_wanted.connect(receivers.run_queue_pass, dispatch_uid="scheduling.queue_pass")
        pools_signals.request_submitted.connect(receivers.approve_or_queue_submitted, dispatch_uid="scheduling.submit")
