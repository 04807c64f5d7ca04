"""REST routes of the scheduling app, registered on the shared router (core/api.py): the pool requests' viewset
with the queue in it (in place of pools'), and the procurement what-if."""

from django.urls import path

from core.api import router

from . import procurement, views

router.register("pool-requests", views.PoolRequestViewSet, basename="poolrequest")

urlpatterns = [
    path("procurement/what-if/", procurement.WhatIfView.as_view(), name="procurement-what-if"),
]
