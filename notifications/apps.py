from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "notifications"

    def ready(self) -> None:
        from . import receivers  # cycle: receivers import models, which need the app registry

        receivers.connect()
