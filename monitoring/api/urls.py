"""REST routes of the monitoring app, registered on the shared router (core/api.py)."""

from core.api import router

from . import views

# The pools' cards with their utilisation (monitoring's data): pools/api/urls.py leaves this route to us.
router.register("pools", views.PoolCardViewSet, basename="gpupool")
router.register("monitoring/series", views.SeriesViewSet, basename="metric-series")
router.register("monitoring/pools", views.PoolUtilisationViewSet, basename="pool-utilisation")
router.register("monitoring/health-events", views.HealthEventViewSet, basename="health-event")
router.register("monitoring/idle-reservations", views.IdleReservationViewSet, basename="idle-reservation")
router.register("monitoring/trespass-events", views.TrespassEventViewSet, basename="trespass-event")

urlpatterns: list = []
