"""The members' front door: `/` per persona, the login page, the pool request form and the API token page."""

import datetime as dt

import pytest
from django.utils import timezone

from pools.models import PoolRequest
from tenancy.models import ApiToken

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --- `/` -----------------------------------------------------------------------------------------


def test_anonymous_is_sent_to_the_members_login_page(client, settings):
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, "/accounts/login/")
    assert settings.LOGIN_URL == "/accounts/login/"
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert b'action="/accounts/login/"' in page.content


@pytest.mark.parametrize("who", ["bob", "victor"])
def test_a_member_or_viewer_is_sent_to_their_project(client, bob, victor, who):
    client.force_login({"bob": bob, "victor": victor}[who])
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, "/projects/team-a/")


def test_a_member_of_several_projects_is_sent_to_the_list(client, bob, other_project):
    from tenancy.roles import set_role

    set_role(other_project, bob, "member")
    client.force_login(bob)
    assert client.get("/")["Location"] == "/projects/"


def test_an_operator_is_sent_to_the_dashboard(client, operator):
    client.force_login(operator)
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, "/admin/dashboard/")


def test_staff_without_dashboard_permissions_are_not_sent_to_the_dashboard(client, staff_nobody, staff_operator):
    client.force_login(staff_nobody)
    assert client.get("/")["Location"] == "/projects/"
    client.force_login(staff_operator)
    assert client.get("/")["Location"] == "/admin/dashboard/"


def test_signing_in_at_the_login_page_leads_through_the_front_door(client, bob):
    response = client.post("/accounts/login/", {"username": "bob", "password": "pw-bob-1"})
    assert (response.status_code, response["Location"]) == (302, "/")
    assert client.get("/")["Location"] == "/projects/team-a/"


def test_project_pages_send_anonymous_users_to_the_login_page(client, project):
    response = client.get("/projects/team-a/requests/new/")
    assert response["Location"] == "/accounts/login/?next=/projects/team-a/requests/new/"


# --- pool request form -----------------------------------------------------------------------------

FORM = {
    "name": "vision-inference",
    "workload_type": "inference",
    "isolation": "full",
    "product": "H100-80GB",
    "count": "2",
}


def test_a_member_submits_a_request_through_the_form(client, bob, project):
    client.force_login(bob)
    assert b"Request GPUs" in client.get("/projects/team-a/").content
    response = client.post("/projects/team-a/requests/new/", FORM | {"create": "1"})
    assert (response.status_code, response["Location"]) == (302, "/projects/team-a/")
    request = PoolRequest.objects.get()
    # The fleet is empty: as the form's check says, the request waits in the queue for capacity.
    assert (request.project, request.requested_by, request.name, request.state, request.wait_if_full) == (
        project, bob, "vision-inference", "queued", True
    )  # fmt: skip
    assert (request.spec_kind, request.product, request.count, request.workload_type) == (
        "full", "H100-80GB", 2, "inference"
    )  # fmt: skip
    assert list(request.transitions.order_by("pk").values_list("to_state", flat=True)) == ["submitted", "queued"]


def test_a_project_admin_may_submit_too(client, alice):
    client.force_login(alice)
    assert client.post("/projects/team-a/requests/new/", FORM | {"create": "1"}).status_code == 302
    assert PoolRequest.objects.count() == 1


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"count": "0"}, "count", "greater than or equal to 1"),
        ({"isolation": "mig", "profile_name": "9g.99gb"}, "profile_name", ""),
        ({"end_at": "2001-01-01 00:00"}, "end_at", "The end must be after the start."),
    ],
)
def test_a_bad_field_is_shown_and_nothing_is_created(client, bob, change, field, message):
    client.force_login(bob)
    response = client.post("/projects/team-a/requests/new/", FORM | change | {"create": "1"})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == [field]
    assert message in " ".join(errors[field])
    assert PoolRequest.objects.count() == 0


def test_a_viewer_cannot_open_or_submit_the_form(client, victor):
    client.force_login(victor)
    assert b"Request GPUs" not in client.get("/projects/team-a/").content
    assert client.get("/projects/team-a/requests/new/").status_code == 403
    assert client.post("/projects/team-a/requests/new/", FORM | {"create": "1"}).status_code == 403
    assert PoolRequest.objects.count() == 0


def test_another_projects_form_is_not_found(client, charlie):
    client.force_login(charlie)
    assert client.get("/projects/team-a/requests/new/").status_code == 404
    assert client.post("/projects/team-a/requests/new/", FORM | {"create": "1"}).status_code == 404
    assert PoolRequest.objects.count() == 0


def test_check_availability_shows_free_units_and_creates_nothing(client, bob):
    client.force_login(bob)
    response = client.post("/projects/team-a/requests/new/", FORM | {"check": "1"})
    assert response.status_code == 200
    offers = response.context["offers"]
    assert (offers["need"], offers["clusters"], offers["enough"]) == (2, [], False)
    assert offers["message"].startswith("need 2 x H100-80GB")
    assert b"Not enough free now" in response.content
    assert PoolRequest.objects.count() == 0


def test_check_availability_counts_what_the_fleet_offers(client, bob, world):
    before = PoolRequest.objects.count()
    client.force_login(bob)
    response = client.post("/projects/team-a/requests/new/", FORM | {"count": "1", "check": "1"})
    offers = response.context["offers"]
    assert (offers["clusters"], offers["enough"], offers["message"]) == ([{"name": "beta", "free": 1}], True, "")
    assert b"beta: 1 free" in response.content
    assert PoolRequest.objects.count() == before


# --- API tokens ------------------------------------------------------------------------------------


def test_a_created_token_is_shown_once_and_works(client, bob):
    client.force_login(bob)
    response = client.post("/accounts/tokens/", {"name": "ci", "expires_in_days": "30"})
    assert response.status_code == 200
    token = ApiToken.objects.get()
    key = response.context["created"].plain_key
    assert (token.user, token.name, token.key_digest) == (bob, "ci", ApiToken.digest(key))
    assert key.encode() in response.content
    again = client.get("/accounts/tokens/")
    assert key.encode() not in again.content and token.key_prefix.encode() in again.content
    client.logout()
    api = client.get("/api/v1/tokens/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.status_code == 200


def test_the_token_page_says_what_an_empty_expiry_gives_and_does_it(client, bob, settings):
    """The page said "Empty: never expires" while the token got 365 days: text and behaviour agree now."""
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 365
    client.force_login(bob)
    page = client.get("/accounts/tokens/").content.decode()
    assert "never expires" not in page
    assert "Every token expires, at most 365 days from now. Empty: 365 days." in page
    client.post("/accounts/tokens/", {"name": "ci", "expires_in_days": ""})
    left = ApiToken.objects.get().expires_at - timezone.now()
    assert dt.timedelta(days=364) < left <= dt.timedelta(days=365)


def test_with_no_maximum_lifetime_the_token_page_says_never(client, bob, settings):
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 0
    client.force_login(bob)
    assert "Empty: never expires (no maximum lifetime is set)." in client.get("/accounts/tokens/").content.decode()
    client.post("/accounts/tokens/", {"name": "ci", "expires_in_days": ""})
    assert ApiToken.objects.get().expires_at is None


def test_revoking_on_the_page_revokes_the_tokens_created_with_it(client, bob):
    root, _ = ApiToken.issue(bob, "root")
    child, _ = ApiToken.issue(bob, "child", parent=root)
    client.force_login(bob)
    response = client.post(f"/accounts/tokens/{root.pk}/revoke/", follow=True)
    assert "and the tokens created with it revoked: 2." in response.content.decode()
    child.refresh_from_db()
    assert child.revoked_at is not None


def test_a_bad_token_form_creates_nothing(client, bob):
    client.force_login(bob)
    response = client.post("/accounts/tokens/", {"name": "", "expires_in_days": "0"})
    assert response.status_code == 200
    assert set(response.context["form"].errors) == {"name", "expires_in_days"}
    assert ApiToken.objects.count() == 0


def test_revoking_asks_first_and_needs_a_post_with_csrf(bob):
    from django.test import Client

    token, _ = ApiToken.issue(bob, "ci")
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    confirm = client.get(f"/accounts/tokens/{token.pk}/revoke/")
    assert confirm.status_code == 200 and b"Yes, revoke it" in confirm.content
    token.refresh_from_db()
    assert token.revoked_at is None
    assert client.post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 403  # no CSRF token
    token.refresh_from_db()
    assert token.revoked_at is None
    csrf = confirm.cookies["csrftoken"].value
    response = client.post(f"/accounts/tokens/{token.pk}/revoke/", {"csrfmiddlewaretoken": csrf})
    assert (response.status_code, response["Location"]) == (302, "/accounts/tokens/")
    token.refresh_from_db()
    assert token.revoked_at is not None and not token.is_usable


def test_another_users_token_cannot_be_revoked(client, bob, charlie):
    token, _ = ApiToken.issue(charlie, "theirs")
    client.force_login(bob)
    assert client.get(f"/accounts/tokens/{token.pk}/revoke/").status_code == 404
    assert client.post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    assert b"theirs" not in client.get("/accounts/tokens/").content


def test_check_availability_explains_a_mig_shortage_as_approval_would(client, bob, world):
    from pools import units

    before = PoolRequest.objects.count()
    client.force_login(bob)
    change = {"isolation": "mig", "profile_name": "3g.40gb", "product": "H100-80GB", "count": "1", "check": "1"}
    response = client.post("/projects/team-a/requests/new/", FORM | change)
    assert response.status_code == 200, response.context["form"].errors
    offers = response.context["offers"]
    draft = response.context["form"].draft()
    assert offers["enough"] is False
    assert offers["message"] == units.shortage(draft, units.free_by_cluster(draft))[0]
    assert offers["message"].startswith("need 1 x H100-80GB 3g.40gb")
    assert PoolRequest.objects.count() == before
