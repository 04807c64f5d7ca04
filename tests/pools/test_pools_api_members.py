"""Project admins manage members through the API with set_role; a project always keeps an admin."""

import pytest

from tenancy.roles import role_of

pytestmark = pytest.mark.django_db


def url(project, user=None):
    base = f"/api/v1/projects/{project.pk}/members/"
    return base if user is None else f"{base}{user.pk}/"


def test_list_add_change_remove(api, project, alice, bob, victor, django_user_model):
    client = api(alice)
    assert client.get(url(project)).data == [
        {"user": alice.pk, "username": "alice", "role": "admin"},
        {"user": bob.pk, "username": "bob", "role": "member"},
        {"user": victor.pk, "username": "victor", "role": "viewer"},
    ]
    dana = django_user_model.objects.create_user("dana")
    assert client.post(url(project), {"username": "dana", "role": "member"}).status_code == 201
    assert role_of(project, dana) == "member"
    assert client.post(url(project), {"username": "dana", "role": "viewer"}).status_code == 409
    assert client.patch(url(project, dana), {"role": "admin"}).data["role"] == "admin"
    assert role_of(project, dana) == "admin"
    assert client.delete(url(project, victor)).status_code == 204
    assert role_of(project, victor) is None
    assert client.delete(url(project, victor)).status_code == 404


def test_bad_member_input(api, project, alice):
    client = api(alice)
    assert client.post(url(project), {"username": "nobody", "role": "member"}).data == {
        "username": ["No active user 'nobody'."]
    }
    assert set(client.post(url(project), {"username": "alice", "role": "owner"}).data) == {"role"}


def test_the_last_admin_cannot_leave_or_be_demoted(api, project, alice, operator):
    assert api(alice).patch(url(project, alice), {"role": "member"}).status_code == 409
    assert api(operator).delete(url(project, alice)).status_code == 409
    assert role_of(project, alice) == "admin"
