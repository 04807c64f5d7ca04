from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # cycle: app loading; models can only be imported once the registry is ready.
        from pools import cards

        from .cards import utilisation_expression

        cards.register_utilisation(utilisation_expression)
