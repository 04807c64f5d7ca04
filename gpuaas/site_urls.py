"""Pages outside the admin and the API (the project view and /metrics join here)."""

from django.shortcuts import redirect
from django.urls import path

urlpatterns = [
    path("", lambda request: redirect("/admin/"), name="home"),
]
