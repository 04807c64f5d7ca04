"""REST routes of the pools app, registered on the shared router (core/api.py)."""

from django.urls import path

from core.api import router

from . import procurement, request_views, views

router.register("projects", views.ProjectViewSet, basename="project")
router.register("pool-requests", request_views.PoolRequestViewSet, basename="poolrequest")
router.register("best-effort-requests", views.BestEffortRequestViewSet, basename="besteffortrequest")
router.register("auto-approval-policies", request_views.AutoApprovalPolicyViewSet, basename="autoapprovalpolicy")
router.register("pools", views.GpuPoolViewSet, basename="gpupool")
router.register("allocations", views.AllocationViewSet, basename="allocation")
router.register("tokens", views.ApiTokenViewSet, basename="apitoken")

urlpatterns = [
    path("procurement/what-if/", procurement.WhatIfView.as_view(), name="procurement-what-if"),
]
