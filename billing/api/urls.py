"""REST routes of the billing app, registered on the shared router (gpuaas/api.py)."""

urlpatterns: list = []
