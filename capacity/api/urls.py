"""REST routes of the capacity app, registered on the shared router (gpuaas/api.py)."""

urlpatterns: list = []


# --- MIG layouts, reconfigurations, maintenance windows, time-slicing, planning (operators) ---------
from django.urls import path  # noqa: E402

from gpuaas.api import router  # noqa: E402

from . import reconfiguration as _reconfiguration  # noqa: E402

router.register("mig-layouts", _reconfiguration.MigLayoutViewSet, basename="mig-layout")
router.register("mig-reconfigurations", _reconfiguration.MigReconfigurationViewSet, basename="mig-reconfiguration")
router.register("maintenance-windows", _reconfiguration.MaintenanceWindowViewSet, basename="maintenance-window")
router.register("time-slicing-policies", _reconfiguration.TimeSlicingPolicyViewSet, basename="time-slicing-policy")
urlpatterns += [
    path("capacity-plan/", _reconfiguration.CapacityPlanView.as_view(), name="capacity-plan"),
    path("take-offline/", _reconfiguration.TakeOfflineView.as_view(), name="take-offline"),
    path("rebalance/", _reconfiguration.RebalanceView.as_view(), name="rebalance"),
]


# --- Discovery: the read-only capacity mirror (operators) ------------------------------------------
from . import discovery as _discovery  # noqa: E402

router.register("capacity/clusters", _discovery.ClusterViewSet, basename="capacity-cluster")
router.register("capacity/discovery-runs", _discovery.DiscoveryRunViewSet, basename="capacity-discovery-run")
router.register("capacity/nodes", _discovery.NodeViewSet, basename="capacity-node")
router.register("capacity/gpus", _discovery.GpuViewSet, basename="capacity-gpu")
router.register("capacity/specs", _discovery.SpecViewSet, basename="capacity-spec")
