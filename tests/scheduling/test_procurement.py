"""The procurement what-if (scheduling/procurement.py) on worlds whose history the real queue made (bench queue's
replay, benchmarks/queueing/__init__.py: 20 projects, whole H100 GPUs), its API and its admin page."""

import datetime as dt

import pytest
from django.urls import reverse

from benchmarks.queueing import START, Arrival, generate, replay
from scheduling import forecast, procurement

pytestmark = pytest.mark.django_db

DAYS = 3
END = START + dt.timedelta(days=DAYS)
URL = "/api/v1/procurement/what-if/"
H = dt.timedelta(hours=1)


def _history(gpus=16, seed=1):
    """Three days of bench queue's demand through the real queue on `gpus` GPUs; its figures."""
    return replay(generate(gpus=gpus, days=DAYS, seed=seed), gpus=gpus, days=DAYS, policy="queue")


def _what_if(add, **kwargs):
    return procurement.what_if("H100-80GB", "full", add, window_days=DAYS, now=END, **kwargs)


@pytest.mark.parametrize("seed", [1, 3])
def test_plus_zero_replays_the_history_it_was_read_from(seed):
    result = _history(seed=seed)
    answer = _what_if([0])
    assert result["mean_wait_h"] > 0  # a history where requests waited
    assert answer["observed"]["mean_wait_h"] == result["mean_wait_h"]
    assert answer["answers"][0]["mean_wait_h"] == pytest.approx(result["mean_wait_h"], abs=0.01)
    assert answer["answers"][0]["started"] == answer["observed"]["started"]


def test_more_gpus_never_predict_more_wait():
    _history()
    answers = _what_if([0, 8, 16, 32, 64])["answers"]
    waits = [a["mean_wait_h"] for a in answers]
    assert waits[0] > waits[-1]
    assert waits == sorted(waits, reverse=True)
    assert [a["p90_wait_h"] for a in answers] == sorted((a["p90_wait_h"] for a in answers), reverse=True)
    assert [a["slots"] for a in answers] == [16, 24, 32, 48, 80]
    held = [a["utilisation"] * a["slots"] for a in answers]  # with more GPUs, no less of the demand is served
    assert held == sorted(held)


def test_a_month_whose_answer_is_known():
    """One node of 8 GPUs. Project 0 holds all 8 from hour 0 for 10 h; project 1 asks for 8 at hour 1 (5 h of
    work), project 2 for 1 at hour 2 (3 h). The queue: 1 starts at 10 (when 0 releases), 2 at 15 (behind 1).
    With a second node of 8, 1 starts at once there and 2 when 1 is done (6); with two more nodes, nobody waits."""
    arrivals = [
        Arrival(START, 0, "training", 8, 10.0, False, 0.5),
        Arrival(START + H, 1, "training", 8, 5.0, False, 0.5),
        Arrival(START + 2 * H, 2, "development", 1, 3.0, False, 0.2),
    ]
    assert replay(arrivals, gpus=8, days=1, policy="queue")["mean_wait_h"] == round((0 + 9 + 13) / 3, 3)
    answer = procurement.what_if("H100-80GB", "full", [0, 8, 16], window_days=1, now=START + 24 * H)
    assert [a["mean_wait_h"] for a in answer["answers"]] == [round(22 / 3, 3), round(4 / 3, 3), 0.0]
    assert [a["p90_wait_h"] for a in answer["answers"]] == [13.0, 4.0, 0.0]
    # Slot-hours held in the day: 80 + 40 + 3 whatever the GPUs, over 8, 16 and 24 slots.
    assert [a["utilisation"] for a in answer["answers"]] == [
        round(123 / (8 * 24), 3),
        round(123 / (16 * 24), 3),
        round(123 / (24 * 24), 3),
    ]


def test_same_seed_same_answer_and_the_assumptions_are_stated():
    _history()
    first, again = _what_if([0, 8], seed=5), _what_if([0, 8], seed=5)
    assert first == again
    assert first["seed"] == 5 and first["draws"] == procurement.DRAWS
    assert any("stationary" in line for line in first["assumptions"])


def test_the_unit_is_the_seeds_slot_arithmetic(fleet):
    assert procurement.spec_for("H100-80GB", "full").slots_per_gpu == 1
    assert procurement.spec_for("H100-80GB", "3").slots_per_gpu == 4  # time-sliced 4 ways (the seed's 32 of 8)
    assert procurement.spec_for("H100-80GB", "1", "3g.40gb").slots_per_gpu == 2
    node = fleet.node("ts", tier="3", replicas=8)
    fleet.gpu(node)
    assert procurement.spec_for("H100-80GB", "3").slots_per_gpu == 8  # the tier's nodes as configured


def test_added_gpus_come_as_nodes_of_the_fleets_size():
    spec = procurement.spec_for("H100-80GB", "full")
    assert procurement.added_nodes(spec, 20, {1: 8, 2: 8}, True) == {3: 8, 4: 8, 5: 4}
    assert procurement.added_nodes(spec, 0, {1: 8}, True) == {}
    timeslice = procurement.spec_for("H100-80GB", "3")
    assert procurement.added_nodes(timeslice, 3, {0: 16}, False) == {1: 12}


@pytest.mark.parametrize(
    "args, field",
    [
        (("H999", "full"), "product"),
        (("H100-80GB", "9"), "tier"),
        (("H100-80GB", "1"), "profile"),
        (("H100-80GB", "1", "9g.99gb"), "profile"),
        (("H100-80GB", "full", "3g.40gb"), "profile"),
    ],
)
def test_a_spec_it_cannot_answer_names_the_parameter(args, field):
    with pytest.raises(procurement.WhatIfError) as caught:
        procurement.spec_for(*args)
    assert set(caught.value.errors) == {field}


def test_a_single_gpu_goes_to_a_node_no_other_project_holds_as_approval_does():
    units = forecast.Units({1: 4, 2: 8}, True)
    units.own(((1, 4),), project_id=7)
    assert units.take(1, project_id=8) == ((2, 1),)  # node 1 is shared with project 7
    assert units.take(1, project_id=7) == ((1, 1),)  # its own node
    units.give(((2, 1),), project_id=8)
    assert units.take(1, project_id=9) == ((2, 1),)


# --- API and page -------------------------------------------------------------------------------


def test_the_api_answers_operators(api, operator):
    response = api(operator).get(URL, {"product": "H100-80GB", "tier": "full", "add": "0,8"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert [a["add_gpus"] for a in body["answers"]] == [0, 8]
    assert body["unit"]["slots_per_gpu"] == 1 and body["window"]["days"] == 30
    assert body["assumptions"]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"product": "H999", "tier": "full"}, "product"),
        ({"product": "H100-80GB", "tier": "7"}, "tier"),
        ({"product": "H100-80GB", "tier": "1"}, "profile"),
        ({"product": "H100-80GB", "tier": "full", "add": "a,b"}, "add"),
        ({"product": "H100-80GB", "tier": "full", "add": "5000"}, "add"),
        ({"product": "H100-80GB", "tier": "full", "add": "8,8"}, "add"),
        ({"product": "H100-80GB", "tier": "full", "add": ""}, "add"),
        ({"product": "H100-80GB", "tier": "full", "window_days": "0"}, "window_days"),
        ({"tier": "full"}, "product"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, operator, params, field):
    response = api(operator).get(URL, params)
    assert response.status_code == 400
    assert field in response.json()


def test_members_and_anonymous_callers_are_refused(api, bob, staff_nobody):
    params = {"product": "H100-80GB", "tier": "full"}
    assert api(bob).get(URL, params).status_code == 403
    assert api(staff_nobody).get(URL, params).status_code == 403
    assert api().get(URL, params).status_code == 401


def test_the_admin_page_answers_operators_and_refuses_others(client, staff_operator, staff_nobody):
    url = reverse("admin:pools_procurement_what_if")
    client.force_login(staff_nobody)
    assert client.get(url).status_code == 403
    client.force_login(staff_operator)
    assert client.get(url).status_code == 200
    page = client.get(url, {"product": "H100-80GB", "tier": "full", "add": "0,8"})
    assert page.status_code == 200 and page.context["answer"]["answers"][1]["add_gpus"] == 8
    assert b"Assumptions" in page.content
    refused = client.get(url, {"product": "H100-80GB", "tier": "1"})
    assert refused.context["answer"] is None and "profile" in refused.context["errors"]
