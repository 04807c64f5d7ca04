"""A request's transitions: `actor` is null for a move gpuaas made itself, and the schema says so."""

import pytest
from drf_spectacular.generators import SchemaGenerator

from pools import services
from pools.choices import RequestState
from pools.models import PoolRequest

pytestmark = pytest.mark.django_db


def test_the_schema_says_a_transition_actor_may_be_null():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    actor = schema["components"]["schemas"]["Transition"]["properties"]["actor"]
    assert actor["nullable"] is True
    assert actor["readOnly"] is True


def test_a_system_transition_is_answered_with_a_null_actor(api, bob, project):
    body = {"project": project.pk, "product": "H100-80GB", "profile_name": "3g.40gb", "count": 1, "submit": True}
    created = api(bob).post("/api/v1/pool-requests/", body, format="json").data
    services.transition(PoolRequest.objects.get(pk=created["id"]), RequestState.REJECTED, None, "by the system")

    transitions = api(bob).get(f"/api/v1/pool-requests/{created['id']}/").data["transitions"]
    assert [(t["to_state"], t["actor"]) for t in transitions] == [("submitted", "bob"), ("rejected", None)]
