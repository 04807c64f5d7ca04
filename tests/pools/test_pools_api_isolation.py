"""Authorisation matrix over every pools endpoint and persona.

Team A: alice (admin), bob (member), victor (viewer). Team B: charlie. The operator is a superuser;
staff_operator is staff in the Operators group only (same rights); staff_nobody is staff with no
permission and no role: staff status alone grants nothing, so every team-a object is a 404 to them.
Another project's object is a 404 (also through nested ids), a visible object the role may not
touch is a 403; every refusal changes nothing and enqueues nothing.
"""

import pytest

from pools import services
from pools.models import Allocation, GpuPool, PoolRequest, PoolRequestTransition
from tenancy.models import ApiToken
from tenancy.roles import members

pytestmark = pytest.mark.django_db

PERSONAS = ["operator", "staff_operator", "staff_nobody", "alice", "bob", "victor", "charlie", "anonymous"]


@pytest.fixture
def world(
    fleet, project, other_project, make_request, operator, alice, bob, victor, charlie, staff_nobody, staff_operator
):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]] * 4)
    held = make_request(count=1)
    pool = services.approve(held, actor=operator)
    b_held = make_request(count=1, target=other_project, actor=charlie)
    b_pool = services.approve(b_held, actor=operator)
    return {
        "a": project.pk,
        "b": other_project.pk,
        "a_draft": make_request(state="draft", count=1).pk,
        "a_submitted": make_request(count=1).pk,
        "a_held": held.pk,
        "a_pool": pool.pk,
        "a_alloc": pool.allocations.get().pk,
        "b_submitted": make_request(count=1, target=other_project, actor=charlie).pk,
        "b_pool": b_pool.pk,
        "bob": bob.pk,
        "victor": victor.pk,
    }


def snapshot():
    """Everything an endpoint of this app could change."""
    return (
        list(PoolRequest.objects.order_by("pk").values_list("pk", "state", "state_reason")),
        PoolRequestTransition.objects.count(),
        list(GpuPool.objects.order_by("pk").values_list("pk", "state", "released_at")),
        list(Allocation.objects.order_by("pk").values_list("pk", "released_at")),
        [(u.username, role) for p in ("team-a", "team-b") for u, role in members(_project(p))],
        ApiToken.objects.count(),
    )


def _project(slug):
    from tenancy.models import Project

    return Project.objects.get(slug=slug)


def client_for(api, request, persona):
    return api(None if persona == "anonymous" else request.getfixturevalue(persona))


# A spec the world can serve: one that no unit could ever serve is refused at submit (a 400), whoever asks.
NEW_REQUEST = {"product": "H100-80GB", "profile_name": "3g.40gb", "count": 1, "justification": "tests"}

# (method, url, body, {persona: status}); "{x}" placeholders come from the world fixture.
CASES = [
    ("get", "/api/v1/projects/{a}/", None, dict(operator=200, alice=200, bob=200, victor=200, charlie=404)),
    ("get", "/api/v1/projects/{a}/members/", None, dict(operator=200, alice=200, bob=200, victor=200, charlie=404)),
    (
        "post",
        "/api/v1/projects/{a}/members/",
        {"username": "charlie", "role": "viewer"},
        dict(operator=201, alice=201, bob=403, victor=403, charlie=404),
    ),
    (
        "patch",
        "/api/v1/projects/{a}/members/{victor}/",
        {"role": "member"},
        dict(operator=200, alice=200, bob=403, victor=403, charlie=404),
    ),
    (
        "delete",
        "/api/v1/projects/{a}/members/{bob}/",
        None,
        dict(operator=204, alice=204, bob=403, victor=403, charlie=404),
    ),
    ("get", "/api/v1/pool-requests/{a_held}/", None, dict(operator=200, alice=200, bob=200, victor=200, charlie=404)),
    (
        "post",
        "/api/v1/pool-requests/",
        {**NEW_REQUEST, "project": "{a}"},
        dict(operator=201, alice=201, bob=201, victor=403, charlie=400),
    ),
    (
        "post",
        "/api/v1/pool-requests/{a_draft}/submit/",
        {},
        dict(operator=200, alice=200, bob=200, victor=403, charlie=404),
    ),
    (
        "post",
        "/api/v1/pool-requests/{a_submitted}/withdraw/",
        {"reason": "no longer needed"},
        dict(operator=200, alice=200, bob=200, victor=403, charlie=404),
    ),
    (
        "post",
        "/api/v1/pool-requests/{a_submitted}/approve/",
        {"reason": "ok"},
        dict(operator=200, alice=403, bob=403, victor=403, charlie=404),
    ),
    (
        "post",
        "/api/v1/pool-requests/{a_submitted}/reject/",
        {"reason": "no"},
        dict(operator=200, alice=403, bob=403, victor=403, charlie=404),
    ),
    (
        "post",
        "/api/v1/pool-requests/{a_held}/release/",
        {"reason": "done"},
        dict(operator=200, alice=200, bob=403, victor=403, charlie=404),
    ),
    ("get", "/api/v1/pools/{a_pool}/", None, dict(operator=200, alice=200, bob=200, victor=200, charlie=404)),
    ("post", "/api/v1/pools/{a_pool}/retry/", None, dict(operator=200, alice=403, bob=403, victor=403, charlie=404)),
    ("get", "/api/v1/allocations/{a_alloc}/", None, dict(operator=200, alice=200, bob=200, victor=200, charlie=404)),
]


def _expected(method, url, persona, expected):
    if persona == "staff_operator":
        return expected["operator"]
    if persona == "staff_nobody":  # like an outsider: team-a is not theirs, and staff status grants nothing
        return 400 if (method, url) == ("post", "/api/v1/pool-requests/") else 404
    return expected.get(persona, 401)


MATRIX = [
    (method, url, body, persona, _expected(method, url, persona, expected))
    for method, url, body, expected in CASES
    for persona in PERSONAS
]


def _fill(value, world):
    if isinstance(value, str):
        return value.format(**world)
    if isinstance(value, dict):
        return {k: (int(_fill(v, world)) if v == "{a}" else _fill(v, world)) for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    ("method", "url", "body", "persona", "expected"),
    MATRIX,
    ids=[f"{m} {u} as {p}" for m, u, _, p, _ in MATRIX],
)
def test_authorisation_matrix(
    world, api, request, django_capture_on_commit_callbacks, method, url, body, persona, expected
):
    client = client_for(api, request, persona)
    before = snapshot()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = getattr(client, method)(_fill(url, world), _fill(body, world), format="json")
    assert response.status_code == expected, response.content
    if expected >= 400:
        assert snapshot() == before
        assert callbacks == []
    if expected == 400:  # another project's id in the body: "does not exist", like any unknown id
        assert response.data == {"project": [f'Invalid pk "{world["a"]}" - object does not exist.']}


LISTS = ["/api/v1/projects/", "/api/v1/pool-requests/", "/api/v1/pools/", "/api/v1/allocations/"]


@pytest.mark.parametrize("url", LISTS)
def test_lists_show_only_my_projects(world, api, operator, alice, victor, charlie, staff_nobody, staff_operator, url):
    def projects_seen(user):
        rows = api(user).get(url, {"page_size": 100}).data["results"]
        return {row["id"] if url == "/api/v1/projects/" else row["project"] for row in rows}

    assert projects_seen(operator) == {world["a"], world["b"]}
    assert projects_seen(staff_operator) == {world["a"], world["b"]}
    assert projects_seen(staff_nobody) == set()
    assert projects_seen(alice) == {world["a"]}
    assert projects_seen(victor) == {world["a"]}
    assert projects_seen(charlie) == {world["b"]}
    assert api(None).get(url).status_code == 401


@pytest.mark.parametrize("url", LISTS[1:])
@pytest.mark.parametrize("param", ["project", "project_slug"])
def test_filtering_to_another_project_is_empty(world, api, charlie, url, param):
    value = world["a"] if param == "project" else "team-a"
    response = api(charlie).get(url, {param: value})
    assert response.status_code == 200
    assert (response.data["count"], response.data["results"]) == (0, [])


def test_my_role_is_shown_per_project(world, api, operator, alice, bob, victor, charlie):
    def roles(user):
        return {row["slug"]: row["my_role"] for row in api(user).get("/api/v1/projects/").data["results"]}

    assert roles(alice) == {"team-a": "admin"}
    assert roles(bob) == {"team-a": "member"}
    assert roles(victor) == {"team-a": "viewer"}
    assert roles(charlie) == {"team-b": "member"}
    assert roles(operator) == {"team-a": None, "team-b": None}
