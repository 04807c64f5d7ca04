"""The client address behind the ingress: django-ipware honours TRUSTED_PROXY_COUNT, forged entries are ignored.

The simulated ingress is what deploy/ sets up: the app's socket peer (REMOTE_ADDR) is the ingress
pod, and each trusted proxy appends the address it saw to X-Forwarded-For. A client may send its own
X-Forwarded-For; its entries end up on the left and must never be taken for the client.
"""

import time

import pytest
from axes.models import AccessAttempt
from django.core.cache import cache
from django.test import RequestFactory
from rest_framework.test import APIClient

from gpuaas.web.access import client_address

INGRESS = "10.42.0.17"  # the ingress pod, as the web pod sees it
LOAD_BALANCER = "10.0.0.5"
CLIENT = "203.0.113.7"
FORGED = "198.51.100.66"
DOCS = "/api/docs/"  # a public API view, answered to anonymous callers


def request(forwarded_for=None):
    extra = {"REMOTE_ADDR": INGRESS}
    if forwarded_for is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded_for
    return RequestFactory().get("/", **extra)


@pytest.mark.parametrize(
    ("proxies", "forwarded_for", "expected"),
    [
        (0, None, INGRESS),
        (0, f"{FORGED}, {CLIENT}", INGRESS),  # nothing trusted: the header is ignored
        (1, CLIENT, CLIENT),  # client -> ingress -> web
        (1, f"{FORGED}, {CLIENT}", CLIENT),  # the client's own header, appended to by the ingress
        (1, f"{FORGED}, 192.0.2.1, {CLIENT}", CLIENT),
        (1, f"garbage, {CLIENT}", CLIENT),
        (2, f"{CLIENT}, {LOAD_BALANCER}", CLIENT),  # client -> load balancer -> ingress -> web
        (2, f"{FORGED}, {CLIENT}, {LOAD_BALANCER}", CLIENT),
        (1, None, INGRESS),  # a probe inside the cluster, past no proxy: its socket address
        (2, LOAD_BALANCER, INGRESS),  # fewer entries than proxies: nothing to trust in the header
    ],
)
def test_client_address(settings, proxies, forwarded_for, expected):
    settings.TRUSTED_PROXY_COUNT = proxies
    assert client_address(request(forwarded_for)) == expected


def test_lockout_behind_the_ingress_is_per_client_not_per_ingress(client, bob, settings):
    """Behind the ingress a sprayer locks out its own address, not every user who shares the ingress."""
    settings.TRUSTED_PROXY_COUNT = 1
    for i in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            "/accounts/login/",
            {"username": f"guess{i}", "password": "x"},
            REMOTE_ADDR=INGRESS,
            HTTP_X_FORWARDED_FOR=f"10.9.9.{i}, {CLIENT}",  # a fresh forged entry every time: no help
        )
    assert AccessAttempt.objects.filter(ip_address=CLIENT).count() == settings.AXES_FAILURE_LIMIT
    sprayer = client.post(
        "/accounts/login/",
        {"username": "bob", "password": "pw-bob-1"},
        REMOTE_ADDR=INGRESS,
        HTTP_X_FORWARDED_FOR=CLIENT,
    )
    assert sprayer.status_code == 429
    someone_else = client.post(
        "/accounts/login/",
        {"username": "bob", "password": "pw-bob-1"},
        REMOTE_ADDR=INGRESS,
        HTTP_X_FORWARDED_FOR="192.0.2.44",
    )
    assert someone_else.status_code == 302


def test_api_anon_throttle_is_per_client_behind_the_ingress(db, settings):
    """Anonymous API callers are throttled per client: behind the ingress they no longer share one bucket.

    (A public API view: DRF checks permissions before throttles, so a refused call is never counted.)
    """
    settings.TRUSTED_PROXY_COUNT = 1
    cache.clear()
    api = APIClient()
    assert api.get(DOCS, REMOTE_ADDR=INGRESS, HTTP_X_FORWARDED_FOR=CLIENT).status_code == 200
    assert cache.get(f"throttle_anon_{INGRESS}") is None
    assert len(cache.get(f"throttle_anon_{CLIENT}")) == 1

    limit = int(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["anon"].split("/")[0])
    cache.set(f"throttle_anon_{CLIENT}", [time.time()] * limit, 60)
    forged = f"{FORGED}, {CLIENT}"
    assert api.get(DOCS, REMOTE_ADDR=INGRESS, HTTP_X_FORWARDED_FOR=forged).status_code == 429
    assert api.get(DOCS, REMOTE_ADDR=INGRESS, HTTP_X_FORWARDED_FOR="192.0.2.44").status_code == 200
    cache.clear()
