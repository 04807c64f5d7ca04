"""REST routes of the monitoring app, registered on the shared router (gpuaas/api.py)."""

urlpatterns: list = []
