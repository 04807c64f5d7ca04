"""Login brute force: django-axes locks a username (from any address) and an address (on any username)
out of both login pages after N failures, for a cool-off; an operator can unlock earlier."""

import io
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.utils import timezone

LOGIN_URLS = ["/admin/login/", "/accounts/login/"]


def attempt(client, url, password, ip="203.0.113.7", username="operator", **extra):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=ip, **extra)


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
    # A refused attempt during the lockout is not counted: the lock is a cool-off that ends on time.
    assert AccessAttempt.objects.get(username="operator", ip_address="203.0.113.7").failures_since_start == limit


def test_lockout_is_shared_by_both_login_pages(client, operator, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/accounts/login/", "wrong")
    assert attempt(client, "/admin/login/", "pw-operator-1").status_code == 429
    assert not logged_in(client)


def test_forged_forwarded_for_does_not_give_a_fresh_address(client, bob, settings):
    for name in ("u1", "u2", "u3", "u4", "u5"):
        attempt(client, "/admin/login/", "wrong", username=name)
    # X-Forwarded-For is not trusted without TRUSTED_PROXY_COUNT: still the same locked address.
    response = attempt(client, "/accounts/login/", "pw-bob-1", username="bob", HTTP_X_FORWARDED_FOR="198.51.100.1")
    assert response.status_code == 429
    assert not logged_in(client)


def test_a_username_is_locked_across_addresses(client, operator, settings):
    """A distributed guess: each address fails once, the username is locked everywhere."""
    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/admin/login/", "wrong", ip=f"198.51.100.{i + 1}")
    assert attempt(client, "/admin/login/", "pw-operator-1", ip="192.0.2.50").status_code == 429
    assert not logged_in(client)


def test_spraying_usernames_from_one_address_is_limited(client, operator, settings):
    """A spray: one address, a different username each time, then even a real user there is refused."""
    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/accounts/login/", "wrong", username=f"guess{i}")
    assert attempt(client, "/admin/login/", "pw-operator-1").status_code == 429
    assert not logged_in(client)
    # The operator from another address is not affected: neither count covers them there.
    assert attempt(client, "/admin/login/", "pw-operator-1", ip="198.51.100.2").status_code == 302
    assert logged_in(client)


def test_a_success_does_not_reset_the_address_count(client, operator, bob, settings):
    """Signing in to one's own account between guesses must not reset the spray count of the address."""
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "/accounts/login/", "wrong", username=f"guess{i}")
    assert attempt(client, "/accounts/login/", "pw-bob-1", username="bob").status_code == 302
    client.logout()
    assert attempt(client, "/accounts/login/", "wrong", username="guess-last").status_code == 429


def test_the_lockout_is_a_cool_off(client, operator, settings):
    """After AXES_COOLOFF_MINUTES the locked username signs in again, although attempts kept coming."""
    for _ in range(settings.AXES_FAILURE_LIMIT + 3):
        attempt(client, "/admin/login/", "wrong")
    # Age every attempt past the cool-off (as if the time had passed).
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert attempt(client, "/admin/login/", "pw-operator-1").status_code == 302
    assert logged_in(client)


def test_operator_unlocks_a_user_from_the_admin(client, operator, bob, settings):
    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/accounts/login/", "wrong", username="bob", ip=f"198.51.100.{i + 1}")
    assert attempt(client, "/accounts/login/", "pw-bob-1", username="bob", ip="192.0.2.9").status_code == 429
    client.force_login(operator)
    picked = AccessAttempt.objects.filter(username="bob").first()
    response = client.post(
        "/admin/axes/accessattempt/", {"action": "unlock_sign_in", "_selected_action": [picked.pk]}, follow=True
    )
    assert b"Unlocked sign-in for bob" in response.content
    assert not AccessAttempt.objects.filter(username="bob").exists()
    client.logout()
    assert attempt(client, "/accounts/login/", "pw-bob-1", username="bob", ip="192.0.2.9").status_code == 302


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
    attempt(client, "/admin/login/", "wrong", username="mallory")
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
