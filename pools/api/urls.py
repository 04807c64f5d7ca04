"""REST routes of the pools app, registered on the shared router (core/api.py)."""

from core.api import router

from . import request_views, views

router.register("projects", views.ProjectViewSet, basename="project")
# pool-requests: scheduling/api/urls.py registers scheduling's subclass of request_views.PoolRequestViewSet (the
# queue's actions are scheduling's), in the place it had here.
router.register("best-effort-requests", views.BestEffortRequestViewSet, basename="besteffortrequest")
router.register("auto-approval-policies", request_views.AutoApprovalPolicyViewSet, basename="autoapprovalpolicy")
# "pools" (GpuPoolViewSet with the cards' utilisation) is registered by monitoring/api/urls.py, which owns that data.
router.register("allocations", views.AllocationViewSet, basename="allocation")
router.register("tokens", views.ApiTokenViewSet, basename="apitoken")
