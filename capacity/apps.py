from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "capacity"
    default_auto_field = "django.db.models.BigAutoField"
