"""Personal API tokens: the key is shown once, stored hashed, several per user; revoked and expired keys fail."""

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenancy.models import ApiToken

pytestmark = pytest.mark.django_db

URL = "/api/v1/tokens/"


def bearer(key):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_create_returns_the_key_once_and_stores_only_its_digest(api, bob):
    response = api(bob).post(URL, {"name": "laptop", "expires_in_days": 30}, format="json")
    assert response.status_code == 201
    key = response.data["key"]
    assert key.startswith("gpa_") and response.data["key_prefix"] == key[:10]
    token = ApiToken.objects.get(pk=response.data["id"])
    assert token.key_digest == ApiToken.digest(key)
    assert key not in str(ApiToken.objects.values_list().get(pk=token.pk))
    assert dt.timedelta(days=29) < token.expires_at - timezone.now() <= dt.timedelta(days=30)
    listed = api(bob).get(URL).data["results"]
    assert [row["name"] for row in listed] == ["laptop"] and "key" not in listed[0]
    assert "key" not in api(bob).get(f"{URL}{token.pk}/").data


def test_a_key_authenticates_until_revoked(api, bob, project):
    first = api(bob).post(URL, {"name": "ci"}).data
    second = api(bob).post(URL, {"name": "laptop"}).data
    assert bearer(first["key"]).get("/api/v1/projects/").data["results"][0]["slug"] == "team-a"
    assert bearer(second["key"]).get("/api/v1/projects/").status_code == 200
    assert ApiToken.objects.get(pk=first["id"]).last_used_at is not None
    assert bearer(first["key"]).delete(f"{URL}{first['id']}/").status_code == 204
    refused = bearer(first["key"]).get("/api/v1/projects/")
    assert (refused.status_code, refused.data["detail"]) == (401, "Invalid, expired or revoked token.")
    assert refused["WWW-Authenticate"] == "Bearer"
    assert bearer(second["key"]).get("/api/v1/projects/").status_code == 200
    assert api(bob).get(f"{URL}{first['id']}/").data["usable"] is False


def test_expired_and_unknown_keys_are_refused(api, bob):
    created = api(bob).post(URL, {"name": "short"}).data
    ApiToken.objects.filter(pk=created["id"]).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert bearer(created["key"]).get("/api/v1/projects/").status_code == 401
    assert bearer("gpa_not-a-real-key").get("/api/v1/projects/").status_code == 401
    assert api(bob).post(URL, {"name": "x", "expires_at": "2020-01-01T00:00:00Z"}).data == {
        "expires_at": ["The expiry must be in the future."]
    }


def test_other_users_tokens_are_not_found(api, bob, charlie):
    token = api(bob).post(URL, {"name": "mine"}).data
    assert api(charlie).get(f"{URL}{token['id']}/").status_code == 404
    assert api(charlie).delete(f"{URL}{token['id']}/").status_code == 404
    assert ApiToken.objects.get(pk=token["id"]).revoked_at is None
    assert api(charlie).get(URL).data["count"] == 0
    assert api(None).post(URL, {"name": "anon"}).status_code == 401


def test_issue_token_command_prints_a_working_key(bob, capsys):
    from django.core.management import CommandError, call_command

    call_command("issue_token", "bob", "ci", "--days", "7")
    key = capsys.readouterr().out.strip()
    assert bearer(key).get("/api/v1/projects/").status_code == 200
    assert ApiToken.objects.get(user=bob).name == "ci"
    with pytest.raises(CommandError, match="no active user 'nobody'"):
        call_command("issue_token", "nobody", "ci")


# --- A token never outlives its parent nor API_TOKEN_MAX_LIFETIME_DAYS -----------------------------


def _token(user, minutes):
    token, key = ApiToken.issue(user, "short", timezone.now() + dt.timedelta(minutes=minutes))
    return token, key


def test_a_token_cannot_mint_one_that_outlives_it(bob):
    parent, key = _token(bob, 5)
    for body, field in (
        ({"name": "forever", "expires_in_days": 30}, "expires_in_days"),
        ({"name": "later", "expires_at": (parent.expires_at + dt.timedelta(seconds=1)).isoformat()}, "expires_at"),
    ):
        response = bearer(key).post(URL, body, format="json")
        assert response.status_code == 400, response.data
        limit = parent.expires_at.isoformat()
        assert response.data == {field: [f"A token made with a token cannot outlive it: expire at {limit} or sooner."]}
    assert ApiToken.objects.count() == 1


def test_a_token_minted_by_a_token_without_expiry_expires_with_its_parent(bob):
    parent, key = _token(bob, 5)
    response = bearer(key).post(URL, {"name": "child"}, format="json")
    assert response.status_code == 201, response.data
    assert ApiToken.objects.get(pk=response.data["id"]).expires_at == parent.expires_at
    sooner = (parent.expires_at - dt.timedelta(minutes=1)).isoformat()
    assert bearer(key).post(URL, {"name": "sooner", "expires_at": sooner}, format="json").status_code == 201


def test_max_lifetime_applies_to_session_created_tokens(api, bob, settings):
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 10
    response = api(bob).post(URL, {"name": "long", "expires_in_days": 11}, format="json")
    assert response.status_code == 400
    assert list(response.data) == ["expires_in_days"]
    assert response.data["expires_in_days"][0].startswith("Tokens live at most 10 days (API_TOKEN_MAX_LIFETIME_DAYS)")
    assert ApiToken.objects.count() == 0
    created = api(bob).post(URL, {"name": "default"}, format="json")
    assert created.status_code == 201
    lifetime = ApiToken.objects.get(pk=created.data["id"]).expires_at - timezone.now()
    assert dt.timedelta(days=9, hours=23) < lifetime <= dt.timedelta(days=10)


def test_no_max_lifetime_allows_tokens_that_never_expire(api, bob, settings):
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 0
    created = api(bob).post(URL, {"name": "forever"}, format="json")
    assert created.status_code == 201
    assert ApiToken.objects.get(pk=created.data["id"]).expires_at is None


def test_issue_token_command_refuses_more_than_the_max_lifetime(bob, settings):
    from django.core.management import CommandError, call_command

    settings.API_TOKEN_MAX_LIFETIME_DAYS = 30
    with pytest.raises(CommandError, match="at most 30"):
        call_command("issue_token", "bob", "ci", "--days", "31")
    assert ApiToken.objects.count() == 0


def test_the_admin_cannot_change_a_tokens_owner_or_expiry(client, operator, bob, alice):
    token, _ = _token(bob, 60)
    client.force_login(operator)
    url = f"/admin/tenancy/apitoken/{token.pk}/change/"
    page = client.get(url).content.decode()
    assert 'name="user"' not in page and 'name="expires_at_0"' not in page
    client.post(url, {"name": "renamed", "user": str(alice.pk), "expires_at_0": "2099-01-01", "expires_at_1": "00:00"})
    expires_at = token.expires_at
    token.refresh_from_db()
    assert (token.name, token.user, token.expires_at) == ("renamed", bob, expires_at)


# --- Descendants: a token minted with a token goes when it goes ----------------------------------


def test_revoking_a_token_revokes_the_tokens_it_minted_and_theirs(api, bob):
    root = api(bob).post(URL, {"name": "root"}).data
    child = bearer(root["key"]).post(URL, {"name": "child"}).data
    grandchild = bearer(child["key"]).post(URL, {"name": "grandchild"}).data
    sibling = api(bob).post(URL, {"name": "made-in-a-session"}).data  # not minted with a token: no parent
    assert ApiToken.objects.get(pk=grandchild["id"]).parent_id == child["id"]
    assert ApiToken.objects.get(pk=child["id"]).parent_id == root["id"]

    assert api(bob).delete(f"{URL}{root['id']}/").status_code == 204

    for minted in (root, child, grandchild):
        assert bearer(minted["key"]).get("/api/v1/projects/").status_code == 401
    assert bearer(sibling["key"]).get("/api/v1/projects/").status_code == 200
    assert set(ApiToken.objects.filter(revoked_at__isnull=False).values_list("name", flat=True)) == {
        "root",
        "child",
        "grandchild",
    }


def test_revoking_a_child_leaves_its_parent(api, bob):
    root = api(bob).post(URL, {"name": "root"}).data
    child = bearer(root["key"]).post(URL, {"name": "child"}).data
    assert bearer(root["key"]).delete(f"{URL}{child['id']}/").status_code == 204
    assert bearer(child["key"]).get("/api/v1/projects/").status_code == 401
    assert bearer(root["key"]).get("/api/v1/projects/").status_code == 200


def test_revoke_token_counts_and_is_idempotent(bob):
    from tenancy.services import revoke_token

    root, _ = ApiToken.issue(bob, "root")
    child, _ = ApiToken.issue(bob, "child", parent=root)
    ApiToken.issue(bob, "grandchild", parent=child)
    assert revoke_token(root) == 3
    assert revoke_token(root) == 0
    assert ApiToken.objects.usable().count() == 0


def test_without_an_expiry_a_token_gets_the_maximum_lifetime(api, bob, settings):
    """docs/security.md: every token expires; neither expires_at nor expires_in_days gives the maximum."""
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 365
    created = api(bob).post(URL, {"name": "default"}).data
    left = ApiToken.objects.get(pk=created["id"]).expires_at - timezone.now()
    assert dt.timedelta(days=364) < left <= dt.timedelta(days=365)


def test_a_revoked_token_mints_nothing_even_past_authentication(bob):
    """issue() re-reads the parent under its row lock: a revocation that won the race refuses the child."""
    from tenancy.services import revoke_token

    parent, _ = ApiToken.issue(bob, "parent")
    revoke_token(parent)
    with pytest.raises(ValueError, match="was revoked"):
        ApiToken.issue(bob, "child", parent=parent)
    assert not ApiToken.objects.filter(parent=parent).exists()
