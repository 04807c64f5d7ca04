"""Domain policy operators set in the admin: the value in force, how it is read, and who may change it."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.core.exceptions import ImproperlyConfigured
from django.db import ProgrammingError
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from policies import policy, values
from policies.models import PolicyValue
from pools.models import PoolRequest
from scheduling.policy import queue_policy

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/policies/policyvalue/add/"
LIST_URL = "/admin/policies/policyvalue/"


@pytest.fixture
def request_body(project):
    return {"project": project.pk, "product": "H100-80GB", "profile_name": "3g.40gb", "count": 2}


def admin_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_with_no_operator_value_the_setting_holds(settings):
    settings.LENDING_IDLE_H = 7
    assert policy("LENDING_IDLE_H") == 7


def test_an_operator_value_holds_until_it_is_deleted(settings):
    settings.LENDING_IDLE_H = 24
    row = PolicyValue.objects.create(name="LENDING_IDLE_H", value=3)
    PolicyValue.objects.create(name="MONITORING_EVICT_TRESPASS", value=True)
    assert policy("LENDING_IDLE_H") == 3
    assert policy("MONITORING_EVICT_TRESPASS") is True
    assert policy("LENDING_RECLAIM_GRACE_S") == settings.LENDING_RECLAIM_GRACE_S  # not set: the setting's
    row.delete()
    assert policy("LENDING_IDLE_H") == 24


def test_a_name_not_declared_as_policy_is_refused():
    with pytest.raises(ImproperlyConfigured, match="DEBUG is not declared in settings.POLICY"):
        policy("DEBUG")


def test_the_table_is_read_once_per_cache_period(django_assert_num_queries, settings):
    settings.POLICY_CACHE_S = 60
    PolicyValue.objects.create(name="QUEUE_AGED_AFTER_H", value=5)
    with django_assert_num_queries(1):
        assert [policy("QUEUE_AGED_AFTER_H"), policy("LENDING_IDLE_H"), policy("QUEUE_AGED_AFTER_H")] == [
            5,
            settings.LENDING_IDLE_H,
            5,
        ]
    settings.POLICY_CACHE_S = 0
    with django_assert_num_queries(2):
        policy("QUEUE_AGED_AFTER_H")
        policy("QUEUE_AGED_AFTER_H")


def test_another_process_change_is_seen_within_the_cache_period(monkeypatch, settings):
    settings.POLICY_CACHE_S = 10
    clock = [1000.0]
    monkeypatch.setattr(values.time, "monotonic", lambda: clock[0])
    PolicyValue.objects.create(name="MAINTENANCE_GRACE_S", value=600)
    assert policy("MAINTENANCE_GRACE_S") == 600
    # Another process's admin saves: this process gets no signal (an update() sends none either).
    PolicyValue.objects.filter(name="MAINTENANCE_GRACE_S").update(value=60)
    clock[0] += 9.9
    assert policy("MAINTENANCE_GRACE_S") == 600
    clock[0] += 0.1
    assert policy("MAINTENANCE_GRACE_S") == 60


def test_an_operator_sets_a_policy_in_the_admin_and_it_holds_at_once(staff_operator, bob, request_body, settings):
    settings.POOL_REQUEST_MAX_UNITS = 512
    api = APIClient()
    api.force_authenticate(bob)
    assert api.post("/api/v1/pool-requests/", {**request_body, "count": 600}, format="json").status_code == 400

    response = admin_client(staff_operator).post(
        ADD_URL, {"name": "POOL_REQUEST_MAX_UNITS", "value": "1000", "reason": "a training burst"}
    )
    assert response.status_code == 302, response.content
    row = PolicyValue.objects.get()
    assert (row.name, row.value, row.reason, row.changed_by) == (
        "POOL_REQUEST_MAX_UNITS",
        1000,
        "a training burst",
        staff_operator,
    )
    assert LogEntry.objects.filter(user=staff_operator, action_flag=ADDITION, object_id=str(row.pk)).exists()

    accepted = api.post("/api/v1/pool-requests/", {**request_body, "count": 600}, format="json")
    assert accepted.status_code == 201, accepted.content
    assert PoolRequest.objects.get().count == 600
    refused = api.post("/api/v1/pool-requests/", {**request_body, "count": 1001}, format="json")
    assert refused.json() == {"count": ["At most 1000 units per request (POOL_REQUEST_MAX_UNITS)."]}
    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert schema["components"]["schemas"]["PoolRequestDetailRequest"]["properties"]["count"]["maximum"] == 1000


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("POOL_REQUEST_MAX_UNITS", "0", "Give at least 1."),
        ("QUEUE_AGED_AFTER_H", "-1", "Give at least 0."),
        ("LENDING_IDLE_H", "true", "Give a whole number."),
        ("LENDING_IDLE_H", "1.5", "Give a whole number."),
        ("LENDING_IDLE_H", '"24"', "Give a whole number."),
        ("MONITORING_EVICT_TRESPASS", "1", "This setting is a switch: give true or false."),
    ],
)
def test_a_value_of_the_wrong_kind_or_below_the_minimum_is_refused(operator, name, value, message):
    response = admin_client(operator).post(ADD_URL, {"name": name, "value": value})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {"value": [message]}
    assert not PolicyValue.objects.exists()
    assert policy(name) is not None  # still the setting's


def test_the_add_form_offers_only_settings_nobody_has_changed(operator, settings):
    PolicyValue.objects.create(name="LENDING_IDLE_H", value=3)
    form = admin_client(operator).get(ADD_URL).context["adminform"].form
    offered = [name for name, _ in form.fields["name"].choices]
    assert offered == [name for name in settings.POLICY if name != "LENDING_IDLE_H"]
    refused = admin_client(operator).post(ADD_URL, {"name": "LENDING_IDLE_H", "value": "4"})
    assert "name" in refused.context["adminform"].form.errors
    assert PolicyValue.objects.get().value == 3


def test_staff_without_the_permission_may_not_change_policy(staff_nobody):
    client = admin_client(staff_nobody)
    assert client.get(LIST_URL).status_code == 403
    assert client.post(ADD_URL, {"name": "LENDING_IDLE_H", "value": "1"}).status_code == 403
    assert not PolicyValue.objects.exists()


def test_the_list_shows_every_policy_with_the_value_in_force(operator, settings):
    settings.LENDING_RECLAIM_GRACE_S = 120
    PolicyValue.objects.create(name="LENDING_RECLAIM_GRACE_S", value=30)
    response = admin_client(operator).get(LIST_URL)
    rows = {row["name"]: row for row in response.context["policy_in_force"]}
    assert list(rows) == list(settings.POLICY)
    assert (rows["LENDING_RECLAIM_GRACE_S"]["value"], rows["LENDING_RECLAIM_GRACE_S"]["setting"]) == (30, 120)
    assert rows["LENDING_IDLE_H"]["value"] == settings.LENDING_IDLE_H
    assert b'id="policy-in-force"' in response.content


def test_the_queue_ages_requests_by_the_policy_in_force(settings):
    settings.QUEUE_AGED_AFTER_H = 1
    queued = dt.datetime(2026, 12, 1, 8, tzinfo=dt.UTC)
    assert queue_policy.aged_at(queued) == queued + dt.timedelta(hours=1)
    PolicyValue.objects.create(name="QUEUE_AGED_AFTER_H", value=6)
    assert queue_policy.aged_at(queued) == queued + dt.timedelta(hours=6)
    PolicyValue.objects.filter(name="QUEUE_AGED_AFTER_H").update(value=0)
    values.reset()
    assert queue_policy.aged_at(queued) is None


def test_every_declared_policy_is_an_integer_or_switch_setting(settings):
    for name, (minimum, help_text) in settings.POLICY.items():
        assert isinstance(getattr(settings, name), int), name
        assert help_text
        assert minimum is None or getattr(settings, name) >= minimum, name


def test_the_guide_lists_every_policy_with_its_default_and_minimum(settings):
    guide = (Path(settings.BASE_DIR) / "docs" / "policies.md").read_text()
    rows = {}
    for line in guide.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0].strip("`") in settings.POLICY:
            rows[cells[0].strip("`")] = cells[1:3]
    assert set(rows) == set(settings.POLICY)
    for name, (default, minimum) in rows.items():
        value = getattr(settings, name)
        assert default == (str(value).lower() if isinstance(value, bool) else str(value)), name
        assert minimum == ("" if settings.POLICY[name][0] is None else str(settings.POLICY[name][0])), name


def test_a_policy_table_that_cannot_be_read_fails_the_transaction_it_is_read_in(monkeypatch):
    def broken(*args, **kwargs):
        raise ProgrammingError('relation "policies_policyvalue" does not exist')

    monkeypatch.setattr(PolicyValue.objects, "values_list", broken)
    values.reset()
    with pytest.raises(ProgrammingError):
        policy("LENDING_IDLE_H")  # a test runs inside a transaction: the caller sees the error


def test_before_migrate_the_settings_hold_and_the_schema_states_them(tmp_path):
    """`manage.py check --deploy` generates the schema, which reads the request cap, with no tables at all."""
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}", "POOL_REQUEST_MAX_UNITS": "77"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    script = (
        "import django; django.setup()\n"
        "from drf_spectacular.generators import SchemaGenerator\n"
        "from policies import policy\n"
        "schema = SchemaGenerator().get_schema(request=None, public=True)\n"
        "print(policy('POOL_REQUEST_MAX_UNITS'),"
        " schema['components']['schemas']['PoolRequestDetailRequest']['properties']['count']['maximum'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "DJANGO_SETTINGS_MODULE": "gpuaas.settings_test"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["77", "77"]
    assert "the policy table cannot be read" in result.stderr
