"""REST routes of the capacity app, registered on the shared router (core/api.py).

MIG reconfigurations, the take-offline check and rebalancing span capacity and pools: operations/api/urls.py.
"""

from django.urls import path

from core.api import router

from . import discovery, mig, tiers

# MIG layouts, maintenance windows, time-slicing, capacity plan (operators).
router.register("mig-layouts", mig.MigLayoutViewSet, basename="mig-layout")
router.register("maintenance-windows", mig.MaintenanceWindowViewSet, basename="maintenance-window")
router.register("time-slicing-policies", mig.TimeSlicingPolicyViewSet, basename="time-slicing-policy")
urlpatterns = [
    path("capacity-plan/", mig.CapacityPlanView.as_view(), name="capacity-plan"),
]

# Discovery: the read-only capacity mirror (operators).
router.register("capacity/clusters", discovery.ClusterViewSet, basename="capacity-cluster")
router.register("capacity/discovery-runs", discovery.DiscoveryRunViewSet, basename="capacity-discovery-run")
router.register("capacity/nodes", discovery.NodeViewSet, basename="capacity-node")
router.register("capacity/gpus", discovery.GpuViewSet, basename="capacity-gpu")
router.register("capacity/specs", discovery.SpecViewSet, basename="capacity-spec")

# Tier placement: node-to-tier assignments (gpuaas writes gpuaas.io/tier) and each tier's MIG profiles (operators).
router.register("capacity/tier-assignments", tiers.TierAssignmentViewSet, basename="tier-assignment")
router.register("capacity/tier-policies", tiers.TierProfilePolicyViewSet, basename="tier-policy")
