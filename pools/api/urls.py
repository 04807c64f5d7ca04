"""REST routes of the pools app, registered on the shared router (gpuaas/api.py)."""

urlpatterns: list = []
