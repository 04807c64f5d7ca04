"""An HTTP method a route does not support is a 405 everywhere (admin, project pages, API), never a 500.

TRACE reached the operator permission, which had no verb for it, and ended in a 500 with a traceback,
anonymously and unthrottled. Every URL pattern of the site is walked and sent TRACE, CONNECT and a
made-up method, anonymously and as an operator: the answer is always 405 with an Allow header
(gpuaas.web.middleware.UnsupportedMethodMiddleware answers before any view or authentication).
"""

from __future__ import annotations

import re

import pytest
from django.test import Client

from gpuaas.checks import routes

pytestmark = pytest.mark.django_db

CONVERTER = re.compile(r"<(?:(?P<kind>\w+):)?\w+>")
REGEX_GROUP = re.compile(r"\(\?P<\w+>[^)]*\)")


def concrete(path: str) -> str:
    """A URL for the pattern `path`: converters and regex groups filled with a value that parses."""
    path = CONVERTER.sub(lambda m: "1" if m["kind"] == "int" else "x", path)
    path = REGEX_GROUP.sub("1", path)
    return "/" + path.replace("^", "").replace("$", "").replace("\\", "")


URLS = sorted({concrete(route.path) for route in routes()})


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "BREW"])
def test_unsupported_methods_are_405_on_every_route_anonymously(method):
    client = Client(raise_request_exception=False)
    answers = {url: client.generic(method, url) for url in URLS}
    assert len(answers) > 100  # the walk found the site (admin, API, project pages)
    assert {url: r.status_code for url, r in answers.items() if r.status_code != 405} == {}
    assert {r["Allow"] for r in answers.values()} == {"GET, HEAD, OPTIONS, POST, PUT, PATCH, DELETE"}


def test_unsupported_method_as_an_operator_is_405_not_500(client, operator):
    """Signed in, past every authentication: still a 405 (the operator permission never sees TRACE)."""
    client.force_login(operator)
    client.raise_request_exception = False
    answers = {url: client.generic("TRACE", url).status_code for url in URLS}
    assert {url: status for url, status in answers.items() if status != 405} == {}


def test_operator_permission_refuses_an_unknown_method_with_405(rf, operator):
    """Defence in depth behind the middleware: the method-to-verb map raises 405, not ImproperlyConfigured."""
    from rest_framework.exceptions import MethodNotAllowed
    from rest_framework.request import Request

    from core.permissions import OperatorPermissions
    from pools.api.request_views import AutoApprovalPolicyViewSet

    request = Request(rf.generic("TRACE", "/api/v1/auto-approval-policies/"))
    request.user = operator
    view = AutoApprovalPolicyViewSet(action=None, request=request, format_kwarg=None)
    with pytest.raises(MethodNotAllowed):
        OperatorPermissions().required(request, view)
