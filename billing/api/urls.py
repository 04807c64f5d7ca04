"""REST routes of the billing app, registered on the shared router (core/api.py)."""

from core.api import router

from . import views

router.register("billing/rate-cards", views.RateCardViewSet, basename="ratecard")
router.register("billing/usage", views.UsageRecordViewSet, basename="usagerecord")
router.register("billing/statements", views.StatementViewSet, basename="statement")
router.register("billing/runs", views.BillingRunViewSet, basename="billingrun")

urlpatterns: list = []
