"""Login brute force: django-axes locks a username+address out of both login pages after N failures."""

import io

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command

LOGIN_URLS = ["/admin/login/", "/accounts/login/"]


def attempt(client, url, password, ip="203.0.113.7", **extra):
    return client.post(url, {"username": "operator", "password": password}, REMOTE_ADDR=ip, **extra)


def logged_in(client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("url", LOGIN_URLS)
def test_lockout_after_the_failure_limit(client, operator, settings, url):
    limit = settings.AXES_FAILURE_LIMIT
    assert limit == 5
    for _ in range(limit - 1):
        assert attempt(client, url, "wrong").status_code == 200  # the form again, with its error
    response = attempt(client, url, "wrong")
    assert response.status_code == 429
    assert b"Too many failed sign-ins" in response.content
    # Locked: even the right password is refused, and no session is made.
    response = attempt(client, url, "pw-operator-1")
    assert response.status_code == 429
    assert not logged_in(client)
    # The refused attempt during the lockout counts too.
    assert AccessAttempt.objects.get(username="operator", ip_address="203.0.113.7").failures_since_start == limit + 1


def test_lockout_is_shared_by_both_login_pages(client, operator, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/accounts/login/", "wrong")
    assert attempt(client, "/admin/login/", "pw-operator-1").status_code == 429
    assert not logged_in(client)


def test_other_address_is_not_locked_and_forged_forwarded_for_does_not_help(client, operator, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/admin/login/", "wrong")
    # X-Forwarded-For is not trusted without TRUSTED_PROXY_COUNT: still the same locked address.
    assert attempt(client, "/admin/login/", "pw-operator-1", HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 429
    assert not logged_in(client)
    # The same user from another address is not locked out (lockout is per username and address).
    assert attempt(client, "/admin/login/", "pw-operator-1", ip="198.51.100.2").status_code == 302
    assert logged_in(client)


def test_axes_reset_unlocks(client, operator, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/admin/login/", "wrong")
    call_command("axes_reset", stdout=io.StringIO())
    assert AccessAttempt.objects.count() == 0
    assert attempt(client, "/admin/login/", "pw-operator-1").status_code == 302
    assert logged_in(client)


def test_success_before_the_limit_resets_the_count(client, operator, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "/admin/login/", "wrong")
    assert attempt(client, "/admin/login/", "pw-operator-1").status_code == 302
    assert AccessAttempt.objects.filter(username="operator").count() == 0


def test_access_attempts_are_in_the_admin(client, operator, settings):
    attempt(client, "/admin/login/", "wrong")
    client.force_login(operator)
    response = client.get("/admin/axes/accessattempt/")
    assert response.status_code == 200
    assert b"203.0.113.7" in response.content


def test_api_tokens_do_not_go_through_axes(client, bob):
    from tenancy.models import ApiToken

    _, key = ApiToken.issue(bob, "ci")
    for _ in range(10):
        assert client.get("/api/v1/projects/", HTTP_AUTHORIZATION="Bearer gpa_wrong").status_code == 401
    assert client.get("/api/v1/projects/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    assert AccessAttempt.objects.count() == 0
