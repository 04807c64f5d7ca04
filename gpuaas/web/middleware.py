"""Requests no view of gpuaas serves are answered before any view, authentication or logging of a traceback."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed

# Every method some gpuaas view handles. TRACE and CONNECT are never served (TRACE echoes the request,
# cookies included, to whoever can script a page); anything else is not HTTP gpuaas speaks.
SERVED_METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")


class UnsupportedMethodMiddleware:
    """405 with an Allow header for a method no view serves, on every route (admin, project pages, API).

    Views refuse methods they do not handle themselves, but only after authentication and permission
    checks, and some of those (the admin's custom views, the operator permission's method-to-verb map)
    met TRACE with a 500 and a logged traceback, anonymously. Answering here costs no query.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in SERVED_METHODS:
            return HttpResponseNotAllowed(SERVED_METHODS)
        return self.get_response(request)
