"""The procurement what-if (pools/procurement.py) on worlds whose history the real queue made (bench queue's
replay, benchmarks/queueing.py): monotone in GPUs, +0 reproduces the history, deterministic with a seed."""

import dataclasses
import datetime as dt

import pytest

from benchmarks.queueing import START, generate, replay
from pools import procurement

pytestmark = pytest.mark.django_db

DAYS = 3


def _history(gpus=16, seed=3, one_project=False):
    arrivals = generate(gpus=gpus, days=DAYS, seed=seed)
    if one_project:  # one project: the queue's fair share orders nothing, so it serves by age, as the replay does
        arrivals = [dataclasses.replace(a, project=0) for a in arrivals]
    result = replay(arrivals, gpus=gpus, days=DAYS, policy="queue")
    return result, START + dt.timedelta(days=DAYS)


def test_plus_zero_matches_the_replay_of_the_history():
    result, end = _history(one_project=True)
    answer = procurement.what_if("H100-80GB", "full", [0], window_days=DAYS, now=end)
    print(result, answer["observed"], answer["answers"])
    assert answer["observed"]["mean_wait_h"] == result["mean_wait_h"]
    assert answer["answers"][0]["mean_wait_h"] == pytest.approx(result["mean_wait_h"], rel=0.02)


def test_more_gpus_never_predict_more_wait():
    result, end = _history()
    answer = procurement.what_if("H100-80GB", "full", [0, 8, 16, 32], window_days=DAYS, now=end)
    print(result, answer["answers"])
    waits = [a["mean_wait_h"] for a in answer["answers"]]
    assert waits == sorted(waits, reverse=True)
    assert waits[0] > 0
