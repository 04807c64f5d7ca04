"""Numbers in a query string that no database column could hold are a 400 naming the parameter, on
every list endpoint of /api/v1/: `page`, `page_size` and every integer filter. They used
to reach the database driver, which refused them with an OverflowError (a 500 for any member).

The cases come from the live OpenAPI schema, so an endpoint or filter added later is covered
without editing this file.
"""

from __future__ import annotations

import pytest
from django.db import connection
from rest_framework.test import APIClient

from tenancy.models import Project

pytestmark = pytest.mark.django_db

PREFIX = "/api/v1/"
TOO_BIG = "99999999999999999999"  # 2**66 and more: beyond a 64-bit integer, the widest column anywhere
TOO_SMALL = "-" + TOO_BIG


def _integer_parameters() -> list[tuple[str, str]]:
    """(path, name) of every integer-like query parameter of every list operation (a paginated GET)."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    cases = []
    for path, operations in schema["paths"].items():
        parameters = operations.get("get", {}).get("parameters", [])
        query = {p["name"]: p["schema"].get("type") for p in parameters if p["in"] == "query"}
        if path.startswith(PREFIX) and "page" in query:
            cases += [(path, name) for name, kind in query.items() if kind in ("integer", "number")]
    return sorted(cases)


CASES = _integer_parameters()


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_cases_cover_every_list_and_the_filters_of_the_issue():
    pages = {path for path, name in CASES if name == "page"}
    assert len(pages) >= 25
    assert pages == {path for path, name in CASES if name == "page_size"}
    for path, name in [
        ("/api/v1/allocations/", "project"),
        ("/api/v1/pools/", "project"),
        ("/api/v1/billing/statements/", "project"),
        ("/api/v1/billing/usage/", "allocation"),
        ("/api/v1/mig-reconfigurations/", "node"),  # a model-choice filter
    ]:
        assert (path, name) in CASES


@pytest.mark.parametrize("value", [TOO_BIG, TOO_SMALL])
@pytest.mark.parametrize(("path", "name"), CASES)
def test_an_integer_out_of_range_is_a_400_naming_it(operator, path, name, value):
    response = client_for(operator).get(path, {name: value})
    assert response.status_code == 400, response.content
    assert name in response.json()


@pytest.mark.parametrize("path", ["/api/v1/allocations/", "/api/v1/pools/", "/api/v1/billing/statements/"])
def test_a_member_filtering_by_an_impossible_project_gets_a_400(bob, path):
    response = client_for(bob).get(path, {"project": TOO_BIG})
    assert response.status_code == 400
    assert response.json() == {"project": ["Ensure this value is less than or equal to 9223372036854775807."]}


def test_a_filter_takes_every_value_its_column_holds(bob, project):
    """The bound is the column's (a foreign key to a 64-bit primary key), not an arbitrary one."""
    low, high = connection.ops.integer_field_range(Project._meta.pk.get_internal_type())
    client = client_for(bob)
    for value in (low, high, project.pk):
        response = client.get("/api/v1/pools/", {"project": value})
        assert response.status_code == 200, (value, response.content)
    response = client.get("/api/v1/pools/", {"project": high + 1})
    assert response.json() == {"project": [f"Ensure this value is less than or equal to {high}."]}
    response = client.get("/api/v1/pools/", {"project": low - 1})
    assert response.json() == {"project": [f"Ensure this value is greater than or equal to {low}."]}


@pytest.mark.parametrize(
    ("query", "errors"),
    [
        ({"page": "0"}, {"page": ["Ensure this value is greater than or equal to 1."]}),
        ({"page": "two"}, {"page": ["A valid integer is required."]}),
        ({"page_size": "1001"}, {"page_size": ["Ensure this value is less than or equal to 1000."]}),
        (
            {"page_size": "0", "page": TOO_BIG},
            {
                "page": ["Ensure this value is less than or equal to 9223372036854775807."],
                "page_size": ["Ensure this value is greater than or equal to 1."],
            },
        ),
    ],
)
def test_a_bad_page_or_page_size_is_a_400_naming_it(bob, query, errors):
    response = client_for(bob).get("/api/v1/pool-requests/", query)
    assert response.status_code == 400
    assert response.json() == errors


def test_pages_within_range_behave_as_before(bob, project):
    client = client_for(bob)
    assert client.get("/api/v1/pool-requests/", {"page": "1", "page_size": "1000"}).status_code == 200
    assert client.get("/api/v1/pool-requests/", {"page": "last"}).status_code == 200
    past_the_end = client.get("/api/v1/pool-requests/", {"page": str(2**63 - 1)})
    assert past_the_end.status_code == 404


@pytest.mark.postgres
def test_every_integer_out_of_range_is_a_400_on_postgresql(operator):
    """PostgreSQL's driver refuses what SQLite's does differently (numeric vs bigint): the same cases there."""
    client = client_for(operator)
    wrong = []
    for path, name in CASES:
        for value in (TOO_BIG, TOO_SMALL):
            response = client.get(path, {name: value})
            if response.status_code != 400 or name not in response.json():
                wrong.append((path, name, value, response.status_code))
    assert wrong == []
