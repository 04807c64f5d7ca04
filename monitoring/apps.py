from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pools import cards  # cycle: app loading; models can be imported once the registry is ready

        from .cards import utilisation_expression  # cycle: the same (it imports monitoring's models)

        cards.register_utilisation(utilisation_expression)
