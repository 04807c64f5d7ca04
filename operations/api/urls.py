"""REST routes of the operations app, registered on the shared router (core/api.py)."""

from django.urls import path

from core.api import router

from . import maintenance, planning, reconfiguration

router.register("node-drains", maintenance.NodeDrainViewSet, basename="node-drain")
router.register("mig-reconfigurations", reconfiguration.MigReconfigurationViewSet, basename="mig-reconfiguration")
urlpatterns = [
    path("take-offline/", planning.TakeOfflineView.as_view(), name="take-offline"),
    path("rebalance/", planning.RebalanceView.as_view(), name="rebalance"),
]
