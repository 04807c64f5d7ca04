"""The kinds of failure the longer schemathesis run found (issue #31), one test each, so that each
would fail again if its cause came back: a 404 in a content type the schema does not document,
schema-valid input refused, schema-invalid input accepted, a response that does not match its schema.

tests/api/test_api_schemathesis.py finds such failures by generating requests; these name them."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from core.api import BIGINT_RANGE

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture(scope="module")
def openapi() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def parameter(openapi: dict, path: str, name: str, method: str = "get") -> dict:
    found = [p for p in openapi["paths"][path][method]["parameters"] if p["name"] == name]
    assert len(found) == 1, f"{method.upper()} {path} has no parameter {name}"
    return found[0]["schema"]


def request_schema(openapi: dict, path: str, method: str) -> dict:
    ref = openapi["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return openapi["components"]["schemas"][ref.rsplit("/", 1)[1]]


def enum(openapi: dict, schema: dict) -> list:
    """The enum of a schema, or of the component its allOf names (drf-spectacular names enums)."""
    if "enum" in schema:
        return schema["enum"]
    (ref,) = [part["$ref"] for part in schema["allOf"]]
    return openapi["components"]["schemas"][ref.rsplit("/", 1)[1]]["enum"]


def matches(pattern: str, value: str) -> bool:
    return re.search(pattern, value) is not None


# --- A 404 in the content type every operation documents ---------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/pools/1.5/", "/api/v1/pools/1/2/3/", "/api/v1/no-such-thing/"])
def test_an_api_path_no_route_matches_is_the_documented_json_404(operator, openapi, path):
    response = client_for(operator).get(path)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}  # ErrorSerializer: the documented 404 body
    documented = openapi["paths"]["/api/v1/pools/{id}/"]["get"]["responses"]["404"]["content"]
    assert list(documented) == ["application/json"]


def test_a_page_no_route_matches_stays_an_html_page(client):
    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


# --- Schema-valid input accepted -------------------------------------------------------------------


def test_request_bodies_are_documented_as_json_only(openapi):
    """A form cannot carry a null, a number or a nested object: documenting form bodies promised
    requests that the JSON schema allows and the server refuses."""
    media_types = {
        media_type
        for methods in openapi["paths"].values()
        for operation in methods.values()
        if isinstance(operation, dict) and "requestBody" in operation
        for media_type in operation["requestBody"]["content"]
    }
    assert media_types == {"application/json"}


def test_a_patch_of_a_member_without_a_role_changes_nothing(alice, bob, project):
    from tenancy.roles import role_of

    response = client_for(alice).patch(f"/api/v1/projects/{project.pk}/members/{bob.pk}/", {}, format="json")

    assert response.status_code == 200
    assert response.json() == {"user": bob.pk, "username": "bob", "role": "member"}
    assert role_of(project, bob) == "member"


def test_integer_filters_say_the_range_they_take(operator, openapi):
    schema = parameter(openapi, "/api/v1/allocations/", "project")
    assert schema["type"] == "integer"
    assert (schema["minimum"], schema["maximum"]) == BIGINT_RANGE

    response = client_for(operator).get(f"/api/v1/allocations/?project={schema['maximum']}")
    assert response.status_code == 200


def test_the_page_number_says_its_maximum(operator, openapi):
    schema = parameter(openapi, "/api/v1/allocations/", "page")
    assert schema["maximum"] == BIGINT_RANGE[1]


def test_decimal_patterns_need_a_digit(openapi):
    pattern = request_schema(openapi, "/api/v1/billing/statements/{id}/adjust/", "post")["properties"]["amount"][
        "pattern"
    ]

    for refused in ["", "-", ".", "-."]:
        assert not matches(pattern, refused), refused
    for taken in ["12.50", "-3", ".5", "7.", "999999999999.99"]:
        assert matches(pattern, taken), taken
        Decimal(taken)  # and DRF's DecimalField reads it


def test_wall_clock_times_are_times_of_day(openapi):
    pattern = request_schema(openapi, "/api/v1/maintenance-windows/", "post")["properties"]["start_time"]["pattern"]

    for refused in ["24:00", "12:60", "70:88:27.7", "12:00:60"]:
        assert not matches(pattern, refused), refused
    for taken in ["00:00", "23:59:59.999999", "02:00:00"]:
        assert matches(pattern, taken), taken


def test_billing_periods_are_months_parse_period_takes(openapi):
    from billing.periods import parse_period

    pattern = request_schema(openapi, "/api/v1/billing/statements/generate/", "post")["properties"]["period"]["pattern"]
    assert parameter(openapi, "/api/v1/billing/statements/", "period")["pattern"] == pattern

    for refused in ["rejected", "2026-13", "2026-00", "9999-01", "1969-12", "2026-03-02"]:
        assert not matches(pattern, refused), refused
    for taken in ["2026-03", "1970-01", "9998-12", "2026-03-01"]:
        assert matches(pattern, taken), taken
        parse_period(taken)


def test_gpu_products_are_the_catalog_keys(openapi):
    from capacity.mig.catalog import PRODUCTS

    product = request_schema(openapi, "/api/v1/mig-layouts/", "post")["properties"]["product"]
    assert enum(openapi, product) == sorted(PRODUCTS)
    assert enum(openapi, parameter(openapi, "/api/v1/rebalance/", "product")) == sorted(PRODUCTS)
    assert enum(openapi, parameter(openapi, "/api/v1/capacity-plan/", "product")) == sorted(PRODUCTS)


def test_query_parameters_say_the_bounds_their_serializer_enforces(openapi):
    assert parameter(openapi, "/api/v1/capacity-plan/", "replicas")["minimum"] == 2
    assert parameter(openapi, "/api/v1/rebalance/", "days") | {} == {
        "type": "integer",
        "minimum": 1,
        "maximum": 365,
        "default": 30,
    }
    for path in ["/api/v1/monitoring/pools/", "/api/v1/monitoring/series/{id}/samples/"]:
        assert parameter(openapi, path, "start")["format"] == "date-time"


# --- Schema-invalid input refused ------------------------------------------------------------------


@pytest.mark.parametrize("value", ["5e-324", "yes", "", "2"])
def test_a_boolean_filter_that_is_not_true_or_false_is_a_400(operator, value):
    response = client_for(operator).get(f"/api/v1/monitoring/health-events/?open={value}")

    assert response.status_code == 400
    assert response.json() == {"open": ["Must be true or false."]}


def test_a_boolean_filter_takes_true_and_false(operator):
    for value in ["true", "false"]:
        assert client_for(operator).get(f"/api/v1/monitoring/health-events/?open={value}").status_code == 200


def test_an_empty_choice_filter_is_a_400(operator):
    response = client_for(operator).get("/api/v1/capacity/gpus/?health=")

    assert response.status_code == 400
    assert response.json() == {"health": ["Give a value, or leave the filter out."]}


def test_an_empty_value_stays_a_value_where_the_schema_offers_it(operator, openapi):
    assert "" in enum(openapi, parameter(openapi, "/api/v1/capacity/nodes/", "tier"))  # untiered
    assert client_for(operator).get("/api/v1/capacity/nodes/?tier=").status_code == 200
    assert client_for(operator).get("/api/v1/mig-layouts/?name=").status_code == 200  # any text


@pytest.mark.parametrize("value", ["1.5", "1e-3", "0.0", "1e3"])
def test_an_integer_filter_takes_whole_numbers_only(operator, value):
    response = client_for(operator).get(f"/api/v1/allocations/?project={value}")

    assert response.status_code == 400
    assert response.json() == {"project": ["Enter a whole number."]}


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("/api/v1/capacity-plan/?node_group=", "node_group"),
        ("/api/v1/capacity-plan/?gpus=", "gpus"),
        ("/api/v1/monitoring/pools/?start=", "start"),
    ],
)
def test_an_empty_query_parameter_is_a_400_not_left_out(operator, url, name):
    response = client_for(operator).get(url)

    assert response.status_code == 400
    assert list(response.json()) == [name]


def test_free_text_a_client_sends_takes_no_nul(openapi):
    """Django's and DRF's text fields refuse NUL ("Null characters are not allowed.")."""
    query = parameter(openapi, "/api/v1/billing/usage/", "project_slug")["pattern"]
    tags = request_schema(openapi, "/api/v1/pool-requests/", "post")["properties"]["tags"]["items"]["pattern"]

    for pattern in (query, tags):
        assert not matches(pattern, "a\x00b")
        assert matches(pattern, "team-a")


def test_a_dry_run_says_its_unit_cap(openapi):
    assert request_schema(openapi, "/api/v1/pool-requests/dry-run/", "post")["properties"]["count"]["maximum"] == 512


def test_a_text_that_may_not_be_blank_needs_more_than_whitespace(openapi):
    pattern = request_schema(openapi, "/api/v1/auto-approval-policies/", "post")["properties"]["name"]["pattern"]

    for refused in ["\f", "  ", "\x1c", "\x85", "a\x00"]:
        assert not matches(pattern, refused), repr(refused)
    for taken in ["a", " nightly ", "x\fy"]:
        assert matches(pattern, taken), taken


def test_an_empty_string_for_a_related_id_is_a_400_not_null(operator):
    response = client_for(operator).post("/api/v1/pool-requests/dry-run/", {"cluster": ""}, format="json")

    assert response.status_code == 400
    assert response.json() == {"cluster": ["Give an id (or null), not an empty string."]}


def test_a_number_where_the_schema_says_string_is_a_400_not_stored_as_text(operator):
    """Schemathesis (ST201): DRF's CharField stored {"name": -1.02e16} as the text "-1.020804021792441e+16"."""
    response = client_for(operator).post(
        "/api/v1/auto-approval-policies/", {"name": -1.020804021792441e16, "max_units": 4}, format="json"
    )

    assert response.status_code == 400
    assert response.json() == {"name": ["Not a valid string."]}


def test_an_end_on_the_first_day_of_year_one_is_a_400_not_a_500(operator):
    """The 75-example run (issue #31, seed 1829429731): the default start, end - 24 h, overflowed."""
    response = client_for(operator).get("/api/v1/monitoring/pools/?end=0001-01-01T00:09:06Z")

    assert response.status_code == 400
    assert response.json() == {"end": ["too early to read the day before it; give start."]}


def test_an_ordering_with_a_nul_character_is_a_400_not_ignored(operator, project):
    """The 75-example run (issue #31): every text parameter's schema refuses NUL, yet DRF's ordering filter
    dropped such an ordering and answered 200 (here on a project's members, an action without a list)."""
    for url in (f"/api/v1/projects/{project.pk}/members/", "/api/v1/pools/"):
        response = client_for(operator).get(url, {"ordering": "name\x00x"})

        assert response.status_code == 400, url
        assert response.json() == {"ordering": ["Null characters are not allowed."]}
    assert client_for(operator).get("/api/v1/pools/", {"ordering": "-id"}).status_code == 200


def test_a_json_boolean_is_true_or_false_not_a_number(operator, project):
    """The 75-example run (issue #31): {"lending_enabled": 0} was taken as false. Strict serializers now hold
    every JSON boolean to true or false; an HTML form's "on" stays the browsable API's business."""
    response = client_for(operator).post(
        "/api/v1/pool-requests/dry-run/", {"project": project.pk, "vm": 0}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["vm"] == ["Must be true or false."]
