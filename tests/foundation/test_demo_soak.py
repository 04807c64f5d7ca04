"""bench demo-soak: its page list resolves to real views, and its result counts crashes honestly."""

import pytest
from django.urls import resolve

from benchmarks.demo_soak import SOAK_PAGES, SoakTally


def test_every_soak_page_is_a_routed_url_with_a_known_client():
    for name, who, path in SOAK_PAGES:
        assert who in {"anon", "operator", "member", "token", "metrics"}, name
        resolve(path)  # raises Resolver404 for a page that does not exist
    paths = {path for _, _, path in SOAK_PAGES}
    assert {
        "/admin/login/",
        "/admin/dashboard/",
        "/admin/dashboard/data.json",
        "/projects/vision/",
        "/api/docs/",
        "/metrics",
    } <= paths
    assert sum(1 for _, who, _ in SOAK_PAGES if who == "token") >= 5


def test_result_counts_a_restarted_worker_as_one_crash_and_one_restart():
    tally = SoakTally(minutes=3)
    tally.rounds = 2
    tally.record("dashboard", True)
    tally.record("dashboard", False, "HTTP 502")
    tally.record("metrics", True)
    tally.supervisor = {
        "crashes": 1,
        "restarts": 1,
        "programs": {"worker": {"crashes": 1, "restarts": 1}, "web": {"crashes": 0, "restarts": 0}},
    }
    result = tally.result()
    assert result["crashes"] == 1 and result["restarts"] == 1
    assert result["crashes_by_process"] == {"worker": 1}
    assert (result["requests"], result["failed_requests"]) == (3, 1)
    assert result["failed_by_page"] == {"dashboard": 1}
    assert result["all_pages_answered_throughout"] is False


@pytest.mark.parametrize("died, failures, expected", [(False, 0, True), (True, 0, False), (False, 1, False)])
def test_all_pages_answered_throughout_needs_no_failure_and_a_living_demo(died, failures, expected):
    tally = SoakTally(minutes=1, rounds=1, demo_died=died)
    for _ in range(failures):
        tally.record("api docs", False, "ConnectionError")
    result = tally.result()
    assert result["all_pages_answered_throughout"] is expected
    assert result["crashes"] == (1 if died else 0)
    assert result["crashes_by_process"] == ({"demo": 1} if died else {})


def test_contradictions_add_up_over_rounds_and_the_cross_check_is_an_operator_page():
    from django.urls import reverse

    from benchmarks.demo_soak import CROSSCHECK_PATH

    assert CROSSCHECK_PATH == reverse("admin:gpuaas_dashboard_crosscheck")
    tally = SoakTally(minutes=1, rounds=2)
    tally.crosschecked({"contradictions": 0, "items": []})
    tally.crosschecked(
        {"contradictions": 2, "items": [{"message": "prod 1g.10gb: form says 3"}, {"message": "prod 2g: 1"}]}
    )
    result = tally.result()
    assert (result["crosschecks"], result["contradictions"]) == (2, 2)
    assert [line.split(" ", 1)[1] for line in tally.first_contradictions] == ["prod 1g.10gb: form says 3", "prod 2g: 1"]


def test_a_soak_with_a_contradiction_misses_its_correctness_target():
    from benchmarks import registry, targets

    tally = SoakTally(minutes=1, rounds=1)
    tally.crosschecked({"contradictions": 1, "items": [{"message": "x"}]})
    block = targets.block(tally.result(), registry.load()["demo-soak"].targets)
    assert block["correctness_met"] is False
    assert block["targets"]["contradictions == 0"]["met"] is False


def test_trespass_events_are_read_from_the_demos_database_and_missing_means_unknown(tmp_path):
    import sqlite3

    from benchmarks.demo_soak import _trespass_events

    assert _trespass_events(tmp_path) is None
    with sqlite3.connect(tmp_path / "gpuaas.sqlite3") as db:
        db.execute("CREATE TABLE monitoring_trespassevent (id integer primary key)")
        db.executemany("INSERT INTO monitoring_trespassevent VALUES (?)", [(1,), (2,)])
    assert _trespass_events(tmp_path) == 2
