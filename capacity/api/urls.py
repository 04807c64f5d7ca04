"""REST routes of the capacity app, registered on the shared router (gpuaas/api.py)."""

urlpatterns: list = []
