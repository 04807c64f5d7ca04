"""Company sign-in in a browser: an operator and a member sign in through the simulated identity provider
(simcluster/oidc.py), and each loses access at the renewal after their group is removed."""

from __future__ import annotations

import pytest
from django.contrib.sessions.backends.db import SessionStore
from oidc_world import map_groups, running_provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _sign_in(page, start: str, person: str) -> None:
    page.go(start)
    page.click("#oidc-sign-in")
    page.wait_for_selector(f"button[value={person}]")  # the provider's form: pick a person
    page.click(f"button[value={person}]")
    page.wait_for_load_state()


def _renewal_is_due(page) -> None:
    """The session's ID-token renewal time has come (OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS after sign-in)."""
    key = next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid")
    session = SessionStore(session_key=key)
    session["oidc_id_token_expiration"] = 0
    session.save()


def test_browser_operator_and_member_sign_in_through_the_provider_and_lose_access_with_the_group(
    chromium, live_server, project, other_project, page_class
):
    Page = page_class  # noqa: N806 (a class)
    map_groups(project)
    with running_provider() as idp:
        member = Page(chromium.new_context().new_page(), live_server.url)
        _sign_in(member, "/accounts/login/", "mia")
        assert member.url.endswith("/projects/team-a/")  # one project: the front door opens it
        assert "Signed in as mia" in member.inner_text("header")

        operator = Page(chromium.new_context().new_page(), live_server.url)
        _sign_in(operator, "/admin/login/?next=/admin/", "olivia")
        assert operator.url.endswith("/admin/")
        assert operator.request.get(f"{live_server.url}/admin/dashboard/data.json", max_redirects=0).status == 200

        # Offboarding at the provider: mia leaves every group, olivia leaves the operators' group.
        idp.set_groups("mia", [])
        idp.set_groups("olivia", ["team-a-devs"])
        _renewal_is_due(member)
        _renewal_is_due(operator)

        member.goto(f"{live_server.url}/projects/team-a/")  # renewed silently at the provider, then refused
        assert member.url.endswith("/accounts/login/")
        assert "mia is in no group that gpuaas maps to a role" in member.inner_text("main")
        again = member.request.get(f"{live_server.url}/projects/team-a/", max_redirects=0)
        assert again.status == 302 and "/accounts/login/" in again.headers["location"]

        operator.goto(f"{live_server.url}/projects/team-a/")  # still a member of team-a, no longer an operator
        assert operator.url.endswith("/projects/team-a/")
        denied = operator.request.get(f"{live_server.url}/admin/dashboard/data.json", max_redirects=0)
        assert denied.status == 302 and "/admin/login/" in denied.headers["location"]
        for page in (member, operator):
            assert page.errors == [], page.errors
            page.context.close()
