from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "policies"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Policy"

    def ready(self) -> None:
        from . import values  # noqa: F401  (connects the cache's save and delete receivers)
