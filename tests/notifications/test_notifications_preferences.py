"""Who is told what: per-user preferences, per-project webhooks, and who may change them (pages and admin)."""

from __future__ import annotations

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from notifications.choices import EventKind
from notifications.models import Delivery, Preference, WebhookEndpoint
from pools import signals
from pools.models import PoolRequest

pytestmark = pytest.mark.django_db


def refuse(project):
    request = PoolRequest.objects.create(project=project, name="r")
    signals.request_refused.send(sender=PoolRequest, request=request, actor=None, reason="no", at=timezone.now())
    return request


def approve_signal(project):
    request = PoolRequest.objects.create(project=project, name="r")
    signals.request_approved.send(sender=PoolRequest, request=request, actor=None, reason="", at=timezone.now())
    return request


def test_a_member_who_muted_a_kind_or_email_is_not_mailed_it(team, sent):
    alice, bob = team["users"]
    Preference.objects.create(user=alice, project=team["project"], muted=[EventKind.REQUEST_REFUSED])
    Preference.objects.create(user=bob, project=team["project"], email=False)
    sent(lambda: refuse(team["project"]))
    sent(lambda: approve_signal(team["project"]))
    assert sorted((m.to[0], m.subject.split(" ")[-1]) for m in mail.outbox) == [("alice@example.com", "approved")]


def test_a_webhook_gets_only_the_kinds_it_chose_and_none_when_disabled(team, receiver, sent):
    team["json"].events = [EventKind.REQUEST_APPROVED]
    team["json"].save()
    team["slack"].enabled = False
    team["slack"].save()
    sent(lambda: refuse(team["project"]))
    sent(lambda: approve_signal(team["project"]))
    assert [r.json()["kind"] for r in receiver.received] == [EventKind.REQUEST_APPROVED]


def test_users_without_a_role_or_address_or_active_account_are_not_mailed(team, charlie, victor, sent):
    team["users"][1].is_active = False
    team["users"][1].save()
    victor.email = ""
    victor.save()
    sent(lambda: refuse(team["project"]))
    assert sorted(m.to[0] for m in mail.outbox) == ["alice@example.com"]  # not charlie (team-b), bob, victor


def test_another_projects_event_reaches_none_of_team_a(team, other_project, charlie, receiver, sent):
    sent(lambda: refuse(other_project))
    assert [m.to for m in mail.outbox] == [["charlie@example.com"]]
    assert receiver.received == []


# --- The pages ---------------------------------------------------------------------------------------


def kinds_post(project, *, email: bool, kinds: list[str]) -> dict:
    data = {f"p{project.pk}-kinds": kinds}
    if email:
        data[f"p{project.pk}-email"] = "on"
    return data


def test_a_user_edits_their_own_preferences_on_their_page(client, team, bob):
    client.force_login(bob)
    page = client.get(reverse("account_notifications"))
    assert page.status_code == 200 and b"Team A" in page.content
    response = client.post(
        reverse("account_notifications"), kinds_post(team["project"], email=True, kinds=[EventKind.TRESPASS])
    )
    assert response.status_code == 302
    pref = Preference.objects.get()
    assert (pref.user, pref.project, pref.email) == (bob, team["project"], True)
    assert EventKind.TRESPASS not in pref.muted and EventKind.REQUEST_REFUSED in pref.muted
    assert pref.wants(EventKind.TRESPASS) and not pref.wants(EventKind.REQUEST_REFUSED)


def test_a_viewer_may_set_their_own_preferences(client, team, victor):
    client.force_login(victor)
    response = client.post(reverse("account_notifications"), kinds_post(team["project"], email=False, kinds=[]))
    assert response.status_code == 302
    assert Preference.objects.get().user == victor


def test_a_user_cannot_set_preferences_for_another_project_or_user(client, team, other_project, charlie):
    client.force_login(charlie)  # team-b only
    data = {**kinds_post(team["project"], email=False, kinds=[]), "user": team["users"][0].pk}
    data.update(kinds_post(other_project, email=True, kinds=[EventKind.TRESPASS]))
    assert client.post(reverse("account_notifications"), data).status_code == 302
    assert list(Preference.objects.values_list("user__username", "project__slug")) == [("charlie", "team-b")]


def webhook_post(**fields) -> dict:
    return {"name": "new", "url": "https://hooks.example.com/x", "flavour": "json", **fields}


def test_a_project_admin_adds_disables_and_deletes_a_webhook(client, team, alice):
    client.force_login(alice)
    url = reverse("projects:notifications", args=[team["project"].slug])
    page = client.get(url)
    assert page.status_code == 200 and team["json"].secret.encode() in page.content
    assert client.post(url, webhook_post(events=[EventKind.TRESPASS])).status_code == 302
    created = WebhookEndpoint.objects.get(name="new")
    assert (created.project, created.events, created.created_by, len(created.secret)) == (
        team["project"],
        [EventKind.TRESPASS],
        alice,
        64,
    )
    assert client.post(url, {"endpoint": created.pk, "action": "disable"}).status_code == 302
    assert not WebhookEndpoint.objects.get(pk=created.pk).enabled
    assert client.post(url, {"endpoint": created.pk, "action": "delete"}).status_code == 302
    assert not WebhookEndpoint.objects.filter(pk=created.pk).exists()


def test_bad_webhook_input_is_a_400_naming_the_field(client, team, alice):
    client.force_login(alice)
    url = reverse("projects:notifications", args=[team["project"].slug])
    response = client.post(url, webhook_post(url="ftp://x.example.com/", name="ops"))
    assert response.status_code == 400
    assert set(response.context["form"].errors) == {"url", "name"}
    assert WebhookEndpoint.objects.count() == 2


@pytest.mark.parametrize("persona", ["bob", "victor"])
def test_members_and_viewers_see_the_webhooks_but_cannot_change_them(client, team, persona, request):
    user = request.getfixturevalue(persona)
    client.force_login(user)
    url = reverse("projects:notifications", args=[team["project"].slug])
    page = client.get(url)
    assert page.status_code == 200 and b"ops" in page.content
    assert team["json"].secret.encode() not in page.content
    before = list(WebhookEndpoint.objects.order_by("pk").values_list("pk", "name", "url", "enabled"))
    assert client.post(url, webhook_post()).status_code == 403
    assert client.post(url, {"endpoint": team["json"].pk, "action": "delete"}).status_code == 403
    assert client.post(url, {"endpoint": team["json"].pk, "action": "disable"}).status_code == 403
    assert list(WebhookEndpoint.objects.order_by("pk").values_list("pk", "name", "url", "enabled")) == before


def test_an_outsider_gets_404_and_an_admin_cannot_reach_another_projects_webhook(
    client, team, charlie, other_project, alice
):
    client.force_login(charlie)
    url = reverse("projects:notifications", args=[team["project"].slug])
    assert client.get(url).status_code == 404
    assert client.post(url, webhook_post()).status_code == 404
    theirs = WebhookEndpoint.objects.create(project=other_project, name="b", url="https://b.example.com/")
    client.force_login(alice)
    assert client.post(url, {"endpoint": theirs.pk, "action": "delete"}).status_code == 404
    assert WebhookEndpoint.objects.filter(pk=theirs.pk).exists()
    assert WebhookEndpoint.objects.count() == 3


def test_operators_manage_webhooks_and_preferences_in_the_admin(client, team, operator, bob):
    client.force_login(operator)
    for name in ("webhookendpoint", "preference", "event", "delivery"):
        assert client.get(reverse(f"admin:notifications_{name}_changelist")).status_code == 200
    response = client.post(
        reverse("admin:notifications_preference_add"),
        {"user": bob.pk, "project": team["project"].pk, "email": "on", "muted": [EventKind.TRESPASS]},
    )
    assert response.status_code == 302
    assert Preference.objects.get().muted == [EventKind.TRESPASS]
    assert not Delivery.objects.exists()
