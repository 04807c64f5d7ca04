"""The API with the identity provider's bearer tokens: accepted beside gpa_ tokens, roles from groups at
every check, refused once the group is gone, and a 503 (not a 500) when the provider is misconfigured."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone
from oidc_world import CLIENT, map_groups, running_provider
from rest_framework.test import APIClient

from tenancy.models import ApiToken, ExternalIdentity

pytestmark = pytest.mark.django_db


@pytest.fixture
def idp(project):
    map_groups(project)
    with running_provider() as provider:
        yield provider


def _bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _token(idp, username: str, client_id: str = CLIENT.client_id) -> str:
    return idp.tokens_for(username, client_id)["access_token"]


def test_a_members_bearer_token_shows_their_project_and_nothing_operator_only(idp, project, other_project):
    client = _bearer(_token(idp, "mia"))
    response = client.get("/api/v1/projects/")
    assert response.status_code == 200
    assert [p["slug"] for p in response.json()["results"]] == ["team-a"]
    assert client.get("/api/v1/capacity/clusters/").status_code == 403
    user = get_user_model().objects.get(external_identity__subject=idp.claims_of("mia")["sub"])
    assert (user.username, user.is_staff, user.has_usable_password()) == ("mia", False, False)


def test_an_operators_bearer_token_reaches_operator_routes(idp, project, other_project):
    client = _bearer(_token(idp, "olivia"))
    assert client.get("/api/v1/capacity/clusters/").status_code == 200
    assert sorted(p["slug"] for p in client.get("/api/v1/projects/").json()["results"]) == ["team-a", "team-b"]


def test_removing_the_group_removes_access_at_the_next_request(idp, project):
    token = _token(idp, "mia")
    assert _bearer(token).get("/api/v1/projects/").json()["count"] == 1
    idp.set_groups("mia", [])
    response = _bearer(token).get("/api/v1/projects/")
    assert response.status_code == 401
    assert "in no group that gpuaas maps" in response.json()["detail"]
    user = get_user_model().objects.get(username="mia")
    assert not user.groups.exists()  # the role itself is gone, not only this request refused


def test_removing_the_operator_group_takes_operator_away(idp, project):
    token = _token(idp, "olivia")
    assert _bearer(token).get("/api/v1/capacity/clusters/").status_code == 200
    idp.set_groups("olivia", ["team-a-devs"])
    assert _bearer(token).get("/api/v1/capacity/clusters/").status_code == 403
    user = get_user_model().objects.get(username="olivia")
    assert not user.is_staff and not user.groups.filter(name="Operators").exists()


def test_the_answer_is_kept_for_the_cache_period(idp, project):
    token = _token(idp, "mia")
    with override_settings(OIDC_BEARER_CACHE_SECONDS=60):
        assert _bearer(token).get("/api/v1/projects/").status_code == 200
        idp.set_groups("mia", [])
        assert _bearer(token).get("/api/v1/projects/").status_code == 200  # within the documented 60 s


def test_a_revoked_token_is_refused(idp, project):
    token = _token(idp, "mia")
    idp.revoke(token)
    response = _bearer(token).get("/api/v1/projects/")
    assert response.status_code == 401
    assert "userinfo" in response.json()["detail"]


def test_a_token_for_another_client_or_a_forged_one_is_refused(idp, project):
    assert _bearer(_token(idp, "mia", client_id="another-app")).get("/api/v1/projects/").status_code == 401
    assert _bearer("not-a-jwt").get("/api/v1/projects/").status_code == 401
    assert not get_user_model().objects.filter(username="mia").exists()


def test_someone_in_no_mapped_group_gets_no_account(idp, project):
    response = _bearer(_token(idp, "nobody")).get("/api/v1/projects/")
    assert response.status_code == 401
    assert not get_user_model().objects.filter(username="nobody").exists()


def test_gpa_tokens_still_work_beside_the_providers(idp, bob, project):
    _, key = ApiToken.issue(bob, "ci")
    assert _bearer(key).get("/api/v1/projects/").status_code == 200
    assert _bearer("gpa_unknown").get("/api/v1/projects/").status_code == 401


def test_a_linked_persons_gpa_token_stops_when_the_provider_has_not_seen_them(idp, project):
    assert _bearer(_token(idp, "mia")).get("/api/v1/projects/").status_code == 200
    user = get_user_model().objects.get(username="mia")
    _, key = ApiToken.issue(user, "laptop")
    assert _bearer(key).get("/api/v1/projects/").status_code == 200
    ExternalIdentity.objects.filter(user=user).update(last_seen_at=timezone.now() - dt.timedelta(hours=25))
    response = _bearer(key).get("/api/v1/projects/")
    assert response.status_code == 401
    assert "OIDC_PERSONAL_TOKEN_RECHECK_H" in response.json()["detail"]


def test_a_misconfigured_provider_is_a_503_naming_it(project):
    with running_provider() as idp:
        token = _token(idp, "mia")
        with override_settings(OIDC_ISSUER="http://127.0.0.1:9"):  # nothing listens on the discard port
            response = _bearer(token).get("/api/v1/projects/")
    assert response.status_code == 503
    assert "http://127.0.0.1:9/.well-known/openid-configuration" in response.json()["detail"]


def test_a_discovery_document_naming_another_issuer_is_refused(project):
    with running_provider() as idp:
        with override_settings(OIDC_ISSUER=idp.issuer.replace("127.0.0.1", "localhost")):
            response = _bearer(_token(idp, "mia")).get("/api/v1/projects/")
    assert response.status_code == 503
    assert "set OIDC_ISSUER to the provider's issuer exactly" in response.json()["detail"]


def test_with_oidc_off_a_non_gpa_bearer_is_refused_as_before(project):
    response = _bearer("eyJhbGciOi.x.y").get("/api/v1/projects/")
    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid, expired or revoked token."
