"""The choke point fails closed: a view without a declared scope is refused and `manage.py check` names it."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.urls import path
from rest_framework import viewsets
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate

from gpuaas.checks import check_declared_scopes, routes
from core.permissions import ProjectScopedQuerysetMixin
from core.scopes import Scope, scoped
from tenancy.models import Project

pytestmark = pytest.mark.django_db


class Undeclared(viewsets.ViewSet):
    def list(self, request):
        return Response([])


class ClaimsProjectScope(viewsets.ReadOnlyModelViewSet):
    """Says "project" but its queryset never passes through the mixin: refused too."""

    queryset = Project.objects.all()
    scope = Scope.PROJECT


class OwnPermissions(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Project.objects.all()
    permission_classes = [AllowAny]


def plain_view(request):
    return HttpResponse("hello")


class Urls:
    urlpatterns = [
        path("undeclared/", Undeclared.as_view({"get": "list"}), name="undeclared"),
        path("claims/", ClaimsProjectScope.as_view({"get": "list"}), name="claims"),
        path("own-permissions/", OwnPermissions.as_view({"get": "list"}), name="own-permissions"),
        path("plain/", plain_view, name="plain"),
        path("declared/", scoped(Scope.SIGNED_IN)(plain_view), name="declared"),
    ]


def test_a_viewset_without_a_scope_is_refused_to_everyone(bob, operator):
    view = Undeclared.as_view({"get": "list"})
    assert view(APIRequestFactory().get("/undeclared/")).status_code == 401
    for user in (bob, operator):
        request = APIRequestFactory().get("/undeclared/")
        force_authenticate(request, user)
        response = view(request)
        assert response.status_code == 403
        assert "declares no scope" in response.data["detail"]


def test_a_project_scope_without_the_mixin_is_refused(operator):
    request = APIRequestFactory().get("/claims/")
    force_authenticate(request, operator)
    assert ClaimsProjectScope.as_view({"get": "list"})(request).status_code == 403


def test_the_check_names_every_undeclared_route():
    problems = {route.name: route.problems for route in routes(Urls) if route.problems}
    assert set(problems) == {"undeclared", "claims", "own-permissions", "plain"}
    assert problems["claims"] == ["declares scope 'project' but does not use ProjectScopedQuerysetMixin"]
    assert problems["own-permissions"] == ["sets its own permission_classes: declare a scope instead"]
    assert problems["plain"] == ["* declares no scope (None)"]


def test_the_project_declares_every_route():
    assert check_declared_scopes() == []


def test_scoped_refuses_an_unknown_scope_or_an_operator_view_without_permissions():
    with pytest.raises(ImproperlyConfigured):
        scoped("everyone")
    with pytest.raises(ImproperlyConfigured):
        scoped(Scope.OPERATOR)
