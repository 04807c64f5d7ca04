"""GFD node labels recorded from real nodes (tests/fixtures/gfd/, sources in its README).

Discovery's label parsing is run over each capture, and the simulator's labels for the same product and
MIG layout are compared key by key: the same GFD keys (within what the recording GFD release wrote), the
same value formats, the same values wherever they describe the hardware, and the same parse.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from capacity.adapters.kubernetes.objects import Node, parse_node
from capacity.services.node_labels import Spec, node_specs, node_values
from simcluster import Scenario
from simcluster.kube import node_json

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gfd"

# Labels of GPU Operator parts the simulator does not run (NVSM, the driver upgrade controller).
NOT_SIMULATED = {"nvidia.com/gpu.deploy.nvsm", "nvidia.com/gpu-driver-upgrade-state"}
# Written by GFD releases newer than the recordings (k8s-device-plugin tests/expected-output*.txt).
NEWER_GFD = {"nvidia.com/gpu.mode"}
# Values that describe the host or the moment, not the GPU: compared by format only.
SITE_VALUES = re.compile(r"^nvidia\.com/(gfd\.timestamp|gpu\.machine|cuda\.)")
# Known, explained differences (tests/fixtures/gfd/README.md): the label is NVML's device attribute,
# which driver 550.54.15 reports below the profile size `nvidia-smi mig -lgip` prints (39.50 GiB).
KNOWN_DIFFERENCES = {("h100-80gb-hbm3-mixed.json", "nvidia.com/mig-3g.40gb.memory"): ("40320", "40448")}

_INT = re.compile(r"^\d+$")
_FORMATS = [
    (
        re.compile(
            r"\.(count|replicas|memory|multiprocessors|major|minor|rev|revision|timestamp)$|\.(slices|engines)\."
        ),
        _INT,
    ),
    (re.compile(r"\.product$"), re.compile(r"^[A-Za-z0-9_.-]+$")),
    (re.compile(r"\.sharing-strategy$"), re.compile(r"^(none|time-slicing|mps)$")),
    (re.compile(r"(capable|present)$"), re.compile(r"^(true|false)$")),
    (re.compile(r"cuda\.(driver-version|runtime-version)\.full$"), re.compile(r"^\d+(\.\d+)+$")),
]

# fixture -> (simulated node group, capacity the capture's node advertised, what discovery must read)
CASES = {
    "h100-80gb-hbm3-mixed.json": (
        {"product": "H100-80GB", "mig_strategy": "mixed", "mig_layout": "all-balanced"},
        # the docs page prints the labels only; capacity follows the count labels
        {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-2g.20gb": "1", "nvidia.com/mig-3g.40gb": "1"},
        {
            "gpu_product": "NVIDIA-H100-80GB-HBM3",
            "gpu_count": 1,
            "gpu_memory_mib": 81559,
            "mig_strategy": "mixed",
            "mig_config": "all-balanced",
            "mig_config_state": "success",
            "timeslice_replicas": 1,
        },
        [
            Spec("nvidia.com/mig-1g.10gb", "mig", "H100-80GB", "1g.10gb", 2, 2, 1),
            Spec("nvidia.com/mig-2g.20gb", "mig", "H100-80GB", "2g.20gb", 1, 1, 1),
            Spec("nvidia.com/mig-3g.40gb", "mig", "H100-80GB", "3g.40gb", 1, 1, 1),
        ],
    ),
    "h100-80gb-hbm3-single-mig-off.json": (
        {"product": "H100-80GB", "mig_strategy": "single", "mig_layout": "all-disabled"},
        {"nvidia.com/gpu": "1"},
        {
            "gpu_product": "NVIDIA-H100-80GB-HBM3",
            "gpu_count": 1,
            "gpu_memory_mib": 81559,
            "mig_strategy": "single",
            "mig_config": "all-disabled",
            "mig_config_state": "success",
            "timeslice_replicas": 1,
        },
        [Spec("nvidia.com/gpu", "full", "H100-80GB", "", 1, 1, 1)],
    ),
    "a100-80gb-pcie-none.json": (
        {"product": "A100-80GB-PCIE", "mig_strategy": "none"},
        {"nvidia.com/gpu": "1"},
        {
            "gpu_product": "NVIDIA-A100-80GB-PCIe",
            "gpu_count": 1,
            "gpu_memory_mib": 81920,
            "mig_strategy": "none",
            "mig_config": "",
            "mig_config_state": "",
            "timeslice_replicas": 1,
        },
        [Spec("nvidia.com/gpu", "full", "A100-80GB-PCIE", "", 1, 1, 1)],
    ),
    "a100-80gb-pcie-single.json": (
        {"product": "A100-80GB-PCIE", "mig_strategy": "single", "mig_layout": "all-1g.10gb"},
        {"nvidia.com/gpu": "7"},
        # GFD's count and memory are the MIG devices'; discovery reports the physical GPU
        {
            "gpu_product": "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb",
            "gpu_count": 1,
            "gpu_memory_mib": 81920,
            "mig_strategy": "single",
            "mig_config": "",
            "mig_config_state": "",
            "timeslice_replicas": 1,
        },
        [Spec("nvidia.com/gpu", "mig", "A100-80GB-PCIE", "1g.10gb", 7, 7, 1)],
    ),
    "a100-80gb-pcie-mixed.json": (
        {"product": "A100-80GB-PCIE", "mig_strategy": "mixed", "mig_layout": {"0": ["3g.40gb", "2g.20gb", "1g.10gb"]}},
        {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1", "nvidia.com/mig-3g.40gb": "1"},
        {
            "gpu_product": "NVIDIA-A100-80GB-PCIe",
            "gpu_count": 1,
            "gpu_memory_mib": 81920,
            "mig_strategy": "mixed",
            "mig_config": "",
            "mig_config_state": "",
            "timeslice_replicas": 1,
        },
        [
            Spec("nvidia.com/mig-1g.10gb", "mig", "A100-80GB-PCIE", "1g.10gb", 1, 1, 1),
            Spec("nvidia.com/mig-2g.20gb", "mig", "A100-80GB-PCIE", "2g.20gb", 1, 1, 1),
            Spec("nvidia.com/mig-3g.40gb", "mig", "A100-80GB-PCIE", "3g.40gb", 1, 1, 1),
        ],
    ),
}
# Recorded by the 2024 GFD (driver 550): its key set is the simulator's. The 2023 ones wrote fewer labels.
SAME_RELEASE = {"h100-80gb-hbm3-mixed.json", "h100-80gb-hbm3-single-mig-off.json"}


def recorded(name: str) -> dict[str, str]:
    return json.loads((FIXTURES / name).read_text())


def recorded_node(name: str) -> Node:
    capacity = CASES[name][1]
    return Node(name, "uid", "1", recorded(name), {}, dict(capacity), dict(capacity), False, True)


def simulated_node(group: dict) -> Node:
    spec = {
        "name": "gfd",
        "seed": 1,
        "clusters": [{"name": "lab", "node_groups": [{"name_prefix": "n", "count": 1, "gpus_per_node": 1, **group}]}],
    }
    state = Scenario.from_dict(spec).build()
    cluster = state.cluster()
    return parse_node(json.loads(node_json(cluster, cluster.nodes["n-01"])))


def nvidia(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}


def _format(key: str) -> re.Pattern | None:
    return next((fmt for pattern, fmt in _FORMATS if pattern.search(key)), None)


def test_every_fixture_is_covered():
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_discovery_reads_the_recorded_labels(name):
    node = recorded_node(name)
    values = node_values(node)
    expected_values, expected_specs = CASES[name][2], CASES[name][3]
    assert {k: values[k] for k in expected_values} == expected_values
    assert sorted(node_specs(node, values)) == expected_specs


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_labels_have_the_recorded_keys_formats_and_values(name):
    real = nvidia(recorded(name))
    sim = nvidia(simulated_node(CASES[name][0]).labels)
    real_keys = set(real) - NOT_SIMULATED
    if name in SAME_RELEASE:
        assert set(sim) - NEWER_GFD == real_keys
    else:
        assert real_keys <= set(sim), sorted(real_keys - set(sim))
    for key in sorted(real_keys):
        fmt = _format(key)
        if fmt is not None:
            assert fmt.match(real[key]), (key, real[key])  # the pattern describes the real label ...
            assert fmt.match(sim[key]), (key, sim[key])  # ... and the simulator keeps to it
        if SITE_VALUES.search(key):
            continue
        if (name, key) in KNOWN_DIFFERENCES:
            assert (real[key], sim[key]) == KNOWN_DIFFERENCES[(name, key)]
            continue
        assert sim[key] == real[key], key


@pytest.mark.parametrize("name", sorted(CASES))
def test_discovery_reads_the_simulated_node_as_the_recorded_one(name):
    group, capacity = CASES[name][0], CASES[name][1]
    sim = simulated_node(group)
    real = recorded_node(name)
    fields = ("gpu_product", "gpu_count", "gpu_memory_mib", "mig_strategy", "timeslice_replicas")
    sim_values, real_values = node_values(sim), node_values(real)
    assert {k: sim_values[k] for k in fields} == {k: real_values[k] for k in fields}
    assert {r: sim.capacity[r] for r in capacity} == capacity
    assert sorted(node_specs(sim, sim_values)) == sorted(node_specs(real, real_values))
