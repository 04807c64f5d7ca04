"""The state machine: every legal move succeeds and is recorded; every illegal one is refused and changes nothing."""

import itertools

import pytest

from pools import services
from pools.choices import RequestState
from pools.exceptions import IllegalTransition
from pools.models import PoolRequest, PoolRequestTransition

pytestmark = pytest.mark.django_db

STATES = list(RequestState.values)
PAIRS = list(itertools.product(STATES, STATES))
LEGAL = {
    ("draft", "submitted"),
    ("draft", "withdrawn"),
    ("submitted", "approved"),
    ("submitted", "rejected"),
    ("submitted", "withdrawn"),
    ("submitted", "queued"),
    ("queued", "approved"),
    ("queued", "rejected"),
    ("queued", "withdrawn"),
    ("approved", "provisioning"),
    ("provisioning", "active"),
    ("provisioning", "failed"),
    ("provisioning", "released"),
    ("provisioning", "expired"),
    ("active", "released"),
    ("active", "expired"),
    ("failed", "provisioning"),
    ("failed", "released"),
    ("failed", "expired"),
}


def test_the_table_is_exactly_the_documented_workflow():
    table = {(a, b) for a, targets in services.TRANSITIONS.items() for b in targets}
    assert table == LEGAL
    assert set(services.TRANSITIONS) == set(STATES)


@pytest.mark.parametrize(("from_state", "to_state"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_transition(make_request, operator, from_state, to_state):
    request = make_request(state="draft")
    PoolRequest.objects.filter(pk=request.pk).update(state=from_state)
    request.refresh_from_db()
    before = PoolRequestTransition.objects.filter(request=request).count()
    if (from_state, to_state) in LEGAL:
        services.transition(request, to_state, operator, "because")
        request.refresh_from_db()
        assert request.state == to_state
        assert request.state_reason == "because"
        last = PoolRequestTransition.objects.filter(request=request).last()
        assert (last.from_state, last.to_state, last.actor, last.reason) == (from_state, to_state, operator, "because")
    else:
        with pytest.raises(IllegalTransition) as caught:
            services.transition(request, to_state, operator, "because")
        assert (caught.value.from_state, caught.value.to_state) == (from_state, to_state)
        request.refresh_from_db()
        assert request.state == from_state
        assert PoolRequestTransition.objects.filter(request=request).count() == before


def test_a_stale_object_loses_the_claim(make_request, operator, alice):
    request = make_request()
    stale = PoolRequest.objects.get(pk=request.pk)
    services.transition(request, "withdrawn", alice, "not needed")
    with pytest.raises(IllegalTransition) as caught:
        services.transition(stale, "rejected", operator, "no")
    assert caught.value.from_state == "withdrawn"
    assert PoolRequest.objects.get(pk=request.pk).state == "withdrawn"
    assert list(PoolRequestTransition.objects.filter(request=request).values_list("to_state", flat=True)) == [
        "submitted",
        "withdrawn",
    ]
