"""Company sign-in through the pages: the code flow against the simulated provider, roles from groups
at every sign-in and renewal, local passwords switched off, and a misconfigured provider's 503."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from oidc_world import map_groups, running_provider

from tenancy.models import IdentityGroupRole

pytestmark = pytest.mark.django_db


@pytest.fixture
def idp(project):
    map_groups(project)
    with running_provider() as provider:
        yield provider


def _through_provider(client: Client, location: str, browser: requests.Session, username: str | None):
    """Follow the provider's part: pick `username` on its form (None: a silent prompt=none answer)."""
    if username is None:
        answer = browser.get(location, allow_redirects=False)
    else:
        params = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
        answer = browser.post(location.split("?")[0], data={**params, "username": username}, allow_redirects=False)
    assert answer.status_code == 302, answer.text
    back = urlsplit(answer.headers["Location"])
    return client.get(f"{back.path}?{back.query}")


def sign_in(client: Client, username: str, browser: requests.Session | None = None):
    browser = browser or requests.Session()
    start = client.get("/oidc/authenticate/?next=/projects/")
    assert start.status_code == 302
    return _through_provider(client, start["Location"], browser, username), browser


def test_a_member_signs_in_and_lands_on_their_project(idp, project):
    response, _ = sign_in(client := Client(), "mia")
    assert (response.status_code, response["Location"]) == (302, "/projects/")
    assert client.get("/projects/team-a/").status_code == 200
    assert client.get("/admin/").status_code in (302, 403)  # not an operator


def test_an_operator_signs_in_to_the_admin(idp, project):
    client = Client()
    sign_in(client, "olivia")
    assert client.get("/admin/").status_code == 200


def test_a_renewal_after_the_group_is_removed_takes_the_project_away(idp, project):
    client = Client()
    _, browser = sign_in(client, "mia")
    assert client.get("/projects/team-a/").status_code == 200
    idp.set_groups("mia", ["team-b-devs"])
    IdentityGroupRole.objects.create(group="team-b-devs", project=project, role="viewer")
    session = client.session
    session["oidc_id_token_expiration"] = 0  # the renewal time has come
    session.save()
    renew = client.get("/projects/team-a/")
    assert renew.status_code == 302 and "prompt=none" in renew["Location"]
    back = _through_provider(client, renew["Location"], browser, None)
    assert back.status_code == 302
    user = get_user_model().objects.get(username="mia")
    assert [g.name for g in user.groups.all()] == ["project:team-a:viewer"]


def test_a_post_after_the_renewal_time_signs_out_and_changes_nothing(idp, project):
    client = Client()
    sign_in(client, "mia")
    session = client.session
    session["oidc_id_token_expiration"] = 0
    session.save()
    response = client.post("/projects/team-a/requests/new/", {"units": 1})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert client.get("/projects/team-a/").status_code == 302  # signed out


def test_someone_in_no_mapped_group_is_told_why(idp, project):
    response, _ = sign_in(client := Client(), "nobody")
    assert response["Location"] == "/accounts/login/"
    page = client.get("/accounts/login/").content.decode()
    assert "in no group that gpuaas maps to a role" in page
    assert not get_user_model().objects.filter(username="nobody").exists()


def test_a_local_account_is_never_taken_over_by_a_provider_name(idp, project, django_user_model):
    local = django_user_model.objects.create_user("mia", password="pw-local-mia-1")
    sign_in(Client(), "mia")
    linked = get_user_model().objects.get(external_identity__isnull=False)
    assert linked.pk != local.pk and linked.username.startswith("mia-")


def test_the_sign_in_page_offers_the_provider(idp):
    page = Client().get("/accounts/login/").content.decode()
    assert "Sign in with Simulated IdP" in page and 'name="password"' in page
    assert "Sign in with Simulated IdP" in Client().get("/admin/login/").content.decode()


def test_with_local_passwords_off_a_password_is_refused_in_words(idp, bob):
    with override_settings(LOCAL_PASSWORDS=False):
        page = Client().get("/accounts/login/").content.decode()
        assert 'name="password"' not in page and "Sign in with Simulated IdP" in page
        for url in ("/accounts/login/", "/admin/login/"):
            response = Client().post(url, {"username": "bob", "password": "pw-bob-1"})
            assert response.status_code == 403
            assert "Local passwords are switched off" in response.content.decode()
        from django.test import RequestFactory

        from tenancy.oidc.backend import LocalPasswordBackend

        request = RequestFactory().post("/accounts/login/")
        assert LocalPasswordBackend().authenticate(request, username="bob", password="pw-bob-1") is None
    assert Client().post("/accounts/login/", {"username": "bob", "password": "pw-bob-1"}).status_code == 302


def test_a_misconfigured_provider_is_a_503_page_not_a_500(project):
    with running_provider(OIDC_ISSUER="http://127.0.0.1:9"):
        response = Client().get("/oidc/authenticate/")
    assert response.status_code == 503
    page = response.content.decode()
    assert "Sign-in with Simulated IdP is unavailable" in page and "check OIDC_ISSUER" in page


def test_with_oidc_off_the_routes_send_back_to_the_sign_in_page(db):
    response = Client().get("/oidc/authenticate/")
    assert (response.status_code, response["Location"]) == (302, "/accounts/login/")
    assert "Sign in with" not in Client().get("/accounts/login/").content.decode()


def test_a_background_fetch_after_the_renewal_time_gets_a_403_with_the_refresh_url(idp, project):
    client = Client()
    sign_in(client, "olivia")
    session = client.session
    session["oidc_id_token_expiration"] = 0
    session.save()
    response = client.get("/admin/dashboard/data.json", headers={"Sec-Fetch-Mode": "cors"})
    assert response.status_code == 403
    assert response.json()["refresh_url"].startswith(f"{idp.issuer}/authorize?")
