from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pools import prices  # cycle: app loading; models can be imported once the registry is ready

        from .offers import price_lookup  # cycle: the same (it imports billing's models)

        prices.register_price_lookup(price_lookup)
