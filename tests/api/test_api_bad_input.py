"""Bad input is a 400 naming the field and writing nothing: out-of-range time zones and dates in
filters, a year-9999 billing period, malformed per_gpu entries, too many units, unknown fields."""

from __future__ import annotations

import pytest
from reconfig_sim import node_row, start_sim
from rest_framework.test import APIClient

from billing.models import BillingRun, Statement
from capacity.models import MaintenanceWindow, MigLayout, MigReconfiguration, TimeSlicingPolicy
from pools.models import PoolRequest
from tenancy.models import ApiToken
from tenancy.roles import role_of

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture(scope="module")
def openapi() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


@pytest.fixture
def op(operator):
    return client_for(operator)


# --- Time zones and dates in filters ------------------------------------------------------------

FILTERS = [
    "/api/v1/pool-requests/?created_after={}",
    "/api/v1/billing/usage/?hour_before={}",
    "/api/v1/billing/rate-cards/?effective_after={}",
    "/api/v1/monitoring/health-events/?opened_after={}",
]


@pytest.mark.parametrize("url", FILTERS)
@pytest.mark.parametrize("value", ["2026-01-01T00:00:00%2B99:00", "2026-01-01T00:00:00-24:30"])
def test_an_offset_out_of_range_is_a_400(op, url, value):
    response = op.get(url.format(value))
    name = url.split("?")[1].split("=")[0]
    assert response.status_code == 400
    assert response.json() == {name: ["Enter a valid date/time."]}


@pytest.mark.parametrize("url", FILTERS)
@pytest.mark.parametrize("value", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00%2B23:59"])
def test_a_legal_offset_that_leaves_the_calendar_in_utc_is_a_400(op, url, value):
    response = op.get(url.format(value))
    name = url.split("?")[1].split("=")[0]
    assert response.status_code == 400
    assert response.json() == {name: ["Enter a valid date/time."]}


@pytest.mark.parametrize("url", FILTERS)
def test_an_offset_beyond_what_postgresql_takes_still_filters(op, url):
    # -17:16 is legal ISO 8601 but not a PostgreSQL time zone: the filter compares in UTC.
    response = op.get(url.format("0901-04-17T23:20:43-17:16"))
    assert response.status_code == 200


def test_monitoring_ranges_refuse_offsets_out_of_range(op):
    response = op.get("/api/v1/monitoring/pools/?start=2026-01-01T00:00:00%2B99:00")
    assert response.status_code == 400
    assert list(response.json()) == ["start"]


# --- Billing periods ----------------------------------------------------------------------------


def test_generating_a_year_9999_statement_is_a_400(op, project):
    response = op.post(
        "/api/v1/billing/statements/generate/", {"project": project.slug, "period": "9999-12"}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"period": ["'9999-12' is out of range (1970-01 to 9998-12)"]}
    assert Statement.objects.count() == 0


def test_closing_year_9999_is_a_400_and_starts_no_run(op, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = op.post("/api/v1/billing/runs/", {"period": "9999-12"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"period": ["'9999-12' is out of range (1970-01 to 9998-12)"]}
    assert BillingRun.objects.count() == 0
    assert callbacks == []


def test_filtering_statements_by_year_9999_is_a_400(op):
    response = op.get("/api/v1/billing/statements/?period=9999-12")
    assert response.status_code == 400
    assert response.json() == {"period": ["'9999-12' is out of range (1970-01 to 9998-12)"]}


# --- Pool requests: how many units --------------------------------------------------------------


@pytest.fixture
def request_body(project):
    return {"project": project.pk, "product": "H100-80GB", "profile_name": "3g.40gb", "count": 2}


def test_a_request_for_100000_units_is_a_400(bob, request_body):
    response = client_for(bob).post("/api/v1/pool-requests/", {**request_body, "count": 100_000}, format="json")
    assert response.status_code == 400
    assert response.json() == {"count": ["At most 512 units per request (POOL_REQUEST_MAX_UNITS)."]}
    assert PoolRequest.objects.count() == 0


def test_the_unit_cap_is_a_setting(bob, request_body, settings):
    settings.POOL_REQUEST_MAX_UNITS = 8
    client = client_for(bob)
    refused = client.post("/api/v1/pool-requests/", {**request_body, "count": 9}, format="json")
    assert refused.status_code == 400
    assert refused.json() == {"count": ["At most 8 units per request (POOL_REQUEST_MAX_UNITS)."]}
    assert PoolRequest.objects.count() == 0
    accepted = client.post("/api/v1/pool-requests/", {**request_body, "count": 8}, format="json")
    assert accepted.status_code == 201
    assert PoolRequest.objects.get().count == 8


def test_the_schema_states_the_unit_cap(openapi):
    assert openapi["components"]["schemas"]["PoolRequestDetailRequest"]["properties"]["count"]["maximum"] == 512


# --- MIG reconfiguration: malformed per_gpu ------------------------------------------------------


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


@pytest.mark.parametrize(
    ("per_gpu", "message"),
    [
        ({"0": [{}]}, 'GPU 0, entry 0: give exactly "profile" and "start"'),
        ({"0": [{"profile": "3g.40gb"}]}, 'GPU 0, entry 0: give exactly "profile" and "start"'),
        ({"0": [{"profile": "3g.40gb", "start": 0, "x": 1}]}, 'GPU 0, entry 0: give exactly "profile" and "start"'),
        (
            {"0": [{"profile": "3g.40gb", "start": "a"}]},
            'GPU 0, entry 0: "start" must be a memory slice index (0, 1, ...)',
        ),
        (
            {"0": [{"profile": "3g.40gb", "start": None}]},
            'GPU 0, entry 0: "start" must be a memory slice index (0, 1, ...)',
        ),
        (
            {"0": [{"profile": "3g.40gb", "start": True}]},
            'GPU 0, entry 0: "start" must be a memory slice index (0, 1, ...)',
        ),
        ({"0": [{"profile": 5, "start": 0}]}, 'GPU 0, entry 0: "profile" must be a profile name'),
        ({"0": [{"profile": ["3g.40gb"], "start": 0}]}, 'GPU 0, entry 0: "profile" must be a profile name'),
        ({"0": ["3g.40gb", 7]}, 'GPU 0, entry 1: give a profile name or {"profile": name, "start": slice}'),
        ({"0": [""]}, "GPU 0, entry 0: a profile name cannot be empty"),
        ({"0": "3g.40gb"}, "GPU 0: give a list of profiles or null"),
        ({"00": ["7g.80gb"]}, "'00' is not a GPU index (0, 1, 2, ...)"),
        ({"\uff10": ["7g.80gb"]}, "'\uff10' is not a GPU index (0, 1, 2, ...)"),
        ({"-1": ["7g.80gb"]}, "'-1' is not a GPU index (0, 1, 2, ...)"),
    ],
)
def test_malformed_per_gpu_is_a_400_naming_the_entry(sim, op, per_gpu, message, django_capture_on_commit_callbacks):
    body = {"node": node_row("gpu-a").pk, "per_gpu": per_gpu, "backend": "agent", "force": True}
    with django_capture_on_commit_callbacks() as callbacks:
        response = op.post("/api/v1/mig-reconfigurations/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {"per_gpu": [message]}
    assert MigReconfiguration.objects.count() == 0
    assert callbacks == []


def test_well_formed_placements_still_plan(sim, op):
    body = {
        "node": node_row("gpu-a").pk,
        "per_gpu": {"1": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]},
        "backend": "agent",
        "force": True,
    }
    response = op.post("/api/v1/mig-reconfigurations/", body, format="json")
    assert response.status_code == 201, response.json()
    assert MigReconfiguration.objects.get().target == body["per_gpu"]


# --- Unknown fields: every write endpoint family refuses them -----------------------------------


def test_pool_request_with_an_unknown_field_is_a_400(bob, request_body):
    response = client_for(bob).post("/api/v1/pool-requests/", {**request_body, "cout": 4}, format="json")
    assert response.status_code == 400
    assert response.json() == {"cout": ["Unknown field."]}
    assert PoolRequest.objects.count() == 0


def test_unknown_fields_are_named_next_to_other_errors(bob, request_body):
    body = {**request_body, "count": 0, "zeta": 1, "alpha": 2}
    response = client_for(bob).post("/api/v1/pool-requests/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "count": ["Ensure this value is greater than or equal to 1."],
        "alpha": ["Unknown field."],
        "zeta": ["Unknown field."],
    }


def test_read_only_fields_sent_back_are_not_unknown(bob, request_body):
    response = client_for(bob).post("/api/v1/pool-requests/", {**request_body, "state": "approved"}, format="json")
    assert response.status_code == 201
    assert PoolRequest.objects.get().state == "draft"


def test_the_browsable_api_form_token_is_not_an_unknown_field(bob):
    # The HTML form of /api/v1/tokens/ posts the CSRF token along with the fields.
    response = client_for(bob).post(
        "/api/v1/tokens/", {"name": "laptop", "csrfmiddlewaretoken": "x"}, format="multipart"
    )
    assert response.status_code == 201
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["laptop"]


def test_pool_request_actions_refuse_unknown_fields(operator, project):
    pool_request = PoolRequest.objects.create(
        project=project, product="H100-80GB", spec_kind="mig", profile_name="3g.40gb", count=1, state="submitted"
    )
    response = client_for(operator).post(
        f"/api/v1/pool-requests/{pool_request.pk}/reject/", {"reason": "no", "notify": True}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"notify": ["Unknown field."]}
    pool_request.refresh_from_db()
    assert pool_request.state == "submitted"


def test_members_refuse_unknown_fields(alice, bob, project):
    response = client_for(alice).patch(
        f"/api/v1/projects/{project.pk}/members/{bob.pk}/", {"role": "admin", "rank": 1}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"rank": ["Unknown field."]}
    assert role_of(project, bob) == "member"


def test_tokens_refuse_unknown_fields(bob):
    response = client_for(bob).post("/api/v1/tokens/", {"name": "ci", "scope": "admin"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"scope": ["Unknown field."]}
    assert ApiToken.objects.count() == 0


def test_billing_refuses_unknown_fields(op, project):
    generate = op.post(
        "/api/v1/billing/statements/generate/",
        {"project": project.slug, "period": "2026-03", "currency": "USD"},
        format="json",
    )
    close = op.post("/api/v1/billing/runs/", {"period": "2026-03", "dry_run": True}, format="json")
    assert (generate.status_code, generate.json()) == (400, {"currency": ["Unknown field."]})
    assert (close.status_code, close.json()) == (400, {"dry_run": ["Unknown field."]})
    assert (Statement.objects.count(), BillingRun.objects.count()) == (0, 0)


def test_capacity_writes_refuse_unknown_fields(op):
    from capacity.models import Cluster

    cluster = Cluster.objects.create(name="c1", kubeconfig_path="/tmp/c1")
    layout = op.post(
        "/api/v1/mig-layouts/",
        {"name": "halves", "product": "H100-80GB", "gpus": {"all": ["3g.40gb", "3g.40gb"]}, "colour": "red"},
        format="json",
    )
    window = op.post(
        "/api/v1/maintenance-windows/",
        {
            "cluster": cluster.pk,
            "name": "w",
            "starts_at": "2030-01-01T00:00:00Z",
            "ends_at": "2030-01-02T00:00:00Z",
            "tz": "CET",
        },
        format="json",
    )
    policy = op.post(
        "/api/v1/time-slicing-policies/", {"cluster": cluster.pk, "replicas": 4, "memory_limit": 1}, format="json"
    )
    offline = op.post("/api/v1/take-offline/", {"nodes": [], "everything": True}, format="json")
    assert (layout.status_code, layout.json()) == (400, {"colour": ["Unknown field."]})
    assert (window.status_code, window.json()) == (400, {"tz": ["Unknown field."]})
    assert (policy.status_code, policy.json()) == (400, {"memory_limit": ["Unknown field."]})
    assert offline.status_code == 400
    assert offline.json()["everything"] == ["Unknown field."]
    assert (MigLayout.objects.count(), MaintenanceWindow.objects.count(), TimeSlicingPolicy.objects.count()) == (
        0,
        0,
        0,
    )


def test_actions_that_take_no_input_refuse_a_body(op):
    from capacity.models import Cluster

    cluster = Cluster.objects.create(name="c1", kubeconfig_path="/tmp/c1")
    policy = TimeSlicingPolicy.objects.create(cluster=cluster, node_group="g", replicas=4)
    response = op.post(f"/api/v1/time-slicing-policies/{policy.pk}/apply/", {"now": True}, format="json")
    assert response.status_code == 400
    assert response.json() == {"now": ["Unknown field."]}


def test_the_schema_says_request_bodies_take_no_other_fields(openapi):
    schemas = openapi["components"]["schemas"]
    for name in [
        "PoolRequestDetailRequest",
        "ApiTokenRequest",
        "AdjustmentRequest",
        "ReconfigureRequest",
        "MigLayoutRequest",
    ]:
        assert schemas[name]["additionalProperties"] is False, name


# --- Nullable fields in the schema --------------------------------------------------------------


@pytest.mark.parametrize(
    ("component", "field"),
    [
        ("PoolRequest", "cluster_name"),
        ("PoolRequest", "pool"),
        ("PoolRequest", "requested_by"),
        ("PoolRequest", "approved_by"),
        ("Allocation", "mig_instance_uuid"),
        ("Series", "mig_instance_uuid"),
        ("Series", "profile"),
        ("Series", "gi_id"),
        ("HealthEvent", "mig_instance_uuid"),
        ("HealthEvent", "profile"),
        ("MaintenanceWindow", "start_time"),
    ],
)
def test_fields_the_api_writes_null_are_nullable_in_the_schema(openapi, component, field):
    schemas = openapi["components"]["schemas"]
    assert schemas[component]["properties"][field]["nullable"] is True


def test_export_is_documented_as_csv_or_a_json_list(openapi):
    paths = openapi["paths"]
    for path in ["/api/v1/billing/statements/export/", "/api/v1/billing/statements/{id}/download/"]:
        content = paths[path]["get"]["responses"]["200"]["content"]
        assert content["text/csv"]["schema"] == {"type": "string"}
        assert content["application/json"]["schema"]["type"] == "array"
        assert content["application/json"]["schema"]["items"] == {"$ref": "#/components/schemas/ExportStatement"}
