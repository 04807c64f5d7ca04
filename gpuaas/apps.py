from django.apps import AppConfig


class GpuaasConfig(AppConfig):
    name = "gpuaas"

    def ready(self) -> None:
        from . import checks  # noqa: F401  registers the declared-scope check (it imports the API, so not at import)
