"""`manage.py demo --unkind`: the simulator with its real-cluster timings, and a worker that waits long enough."""

import os

import pytest

from gpuaas.management.commands.demo import UNKIND_CONFIGMAP_SYNC_S, UNKIND_SIM_ARGS, Command
from simcluster.runner import build_parser


def test_unkind_arguments_turn_every_timing_knob_real():
    kind = build_parser().parse_args([])
    unkind = build_parser().parse_args(list(UNKIND_SIM_ARGS))
    knobs = (
        "pod_start_delay",
        "pod_termination_grace",
        "configmap_sync_delay",
        "device_plugin_restart",
        "mig_mode_reboot",
    )
    assert {k: getattr(kind, k) for k in knobs} == dict.fromkeys(knobs[:3], 0.0) | dict.fromkeys(knobs[3:], False)
    assert {k: getattr(unkind, k) for k in knobs} == {
        "pod_start_delay": 5.0,
        "pod_termination_grace": 10.0,
        "configmap_sync_delay": float(UNKIND_CONFIGMAP_SYNC_S),
        "device_plugin_restart": True,
        "mig_mode_reboot": True,
    }


@pytest.mark.parametrize("given, expected", [("1", "90"), ("0", "90"), ("junk", "90"), ("120", "120"), ("60", "60")])
def test_unkind_worker_waits_out_the_configmap_sync(monkeypatch, given, expected):
    monkeypatch.setenv("MIG_PARTED_SYNC_S", given)  # demo_environment() sets 1 for the kind simulator
    command = Command()
    command._log = lambda line: None
    command._unkind_environment()
    assert os.environ["MIG_PARTED_SYNC_S"] == expected
