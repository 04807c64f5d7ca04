"""Personal API tokens: the key is shown once, stored hashed, several per user; revoked and expired keys fail."""

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from pools.models import ApiToken

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
