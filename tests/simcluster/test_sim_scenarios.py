"""Scenarios: expected counts equal what the API shows, determinism, parameters, the runner."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from simcluster import Scenario, ScenarioError, load_scenario, main
from simcluster.kube import node_json
from simcluster.scenarios import TIER_LABEL


def observed(api) -> dict:
    """Counts a discovery run would make from the API alone."""
    nodes = api.list_node().items
    gpus, mig, allocatable, tiers = Counter(), Counter(), Counter(), Counter()
    for node in nodes:
        labels = node.metadata.labels
        gpus[labels["nvidia.com/gpu.product"].removesuffix("-SHARED")] += int(labels["nvidia.com/gpu.count"])
        tiers[labels[TIER_LABEL]] += 1
        for key, value in labels.items():
            if key.startswith("nvidia.com/mig-") and key.endswith(".count"):
                mig[key[len("nvidia.com/mig-") : -len(".count")]] += int(value)
        for resource, value in node.status.allocatable.items():
            if resource.startswith("nvidia.com/") and value != "0":
                allocatable[resource] += int(value)
    return {
        "nodes": len(nodes),
        "gpus": dict(gpus),
        "mig": dict(mig),
        "allocatable": dict(allocatable),
        "tiers": dict(tiers),
        "pods": len(api.list_pod_for_all_namespaces().items),
    }


def test_demo_expected_counts_match_the_api(demo, prod, dev):
    expected = demo.expected_counts()
    prod_expected = expected["clusters"]["prod"]
    assert prod_expected["gpus"] == {"H100-80GB": 48}
    assert prod_expected["mig_instances"] == {"H100-80GB": {"1g.10gb": 40, "2g.20gb": 20, "3g.40gb": 32, "4g.40gb": 12}}
    assert expected["totals"]["nodes"] == 8
    assert expected["totals"]["gpus"] == {"H100-80GB": 48, "H200-141GB": 16}
    for api, name, product in ((prod, "prod", "NVIDIA-H100-80GB-HBM3"), (dev, "dev", "NVIDIA-H200")):
        want = expected["clusters"][name]
        got = observed(api)
        assert got["nodes"] == want["nodes"]
        assert got["gpus"] == {product: sum(want["gpus"].values())}
        assert got["mig"] == {k: v for per in want["mig_instances"].values() for k, v in per.items()}
        assert got["allocatable"] == want["allocatable"]
        assert got["tiers"] == want["tiers"]
        assert got["pods"] == want["pods"]
    assert expected["clusters"]["dev"]["allocatable"] == {"nvidia.com/gpu": 64}


def test_builds_are_deterministic(demo):
    first, second = demo.build(), load_scenario("demo").build()
    for name in ("prod", "dev"):
        a, b = first.cluster(name), second.cluster(name)
        assert [node_json(a, n) for n in a.nodes.values()] == [node_json(b, n) for n in b.nodes.values()]
        assert [r.obj for r in a.pods.values()] == [r.obj for r in b.pods.values()]
    for state in (first, second):
        state.tick(10.0)
    a, b = first.cluster("prod"), second.cluster("prod")
    assert [g.energy_mj for n in a.nodes.values() for g in n.gpus] == [
        g.energy_mj for n in b.nodes.values() for g in n.gpus
    ]
    other = Scenario.from_dict({**_yaml("demo"), "seed": 43}).build()
    assert (
        other.cluster("prod").nodes["prod-h100-bal-01"].gpus[0].uuid
        != first.cluster("prod").nodes["prod-h100-bal-01"].gpus[0].uuid
    )


def _yaml(name):
    import yaml

    from simcluster.scenarios import SCENARIO_DIR

    return yaml.safe_load((SCENARIO_DIR / f"{name}.yaml").read_text())


def test_scale_parameters_and_shapes():
    scenario = load_scenario("scale", nodes=40, gpus_per_node=4, product="H200-141GB")
    counts = scenario.expected_counts()["clusters"]["scale"]
    assert counts["nodes"] == 40
    assert counts["gpus"] == {"H200-141GB": 160}
    assert counts["tiers"] == {"1": 16, "2": 8, "3": 6, "full": 10}
    assert counts["mig_instances"]["H200-141GB"]["4g.71gb"] == 8 * 4  # "4g" resolved for H200
    state = scenario.build()
    cluster = state.cluster("scale")
    assert len(cluster.nodes) == 40
    nodes = list(cluster.nodes.values())
    allocatable = Counter()
    for node in nodes:
        for resource, devices in node.devices.items():
            allocatable[resource] += len(devices)
    assert dict(allocatable) == counts["allocatable"]


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ({"product": "V100"}, "unknown GPU product"),
        ({"product": "H100-80GB", "mig_layout": ["5g.50gb"]}, "no MIG profile"),
        ({"product": "H100-80GB", "mig_layout": ["4g", "4g"]}, "does not fit"),
        ({"product": "H100-80GB", "mig_layout": "all-9g"}, "no named MIG config"),
        ({"product": "H100-80GB", "mig_strategy": "weird"}, "mig_strategy"),
    ],
)
def test_scenario_errors_are_clear(group, message):
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict({"name": "bad", "clusters": [{"name": "c", "node_groups": [{"name_prefix": "n", **group}]}]})


def test_per_gpu_layouts():
    scenario = Scenario.from_dict(
        {
            "name": "t",
            "clusters": [
                {
                    "name": "c",
                    "node_groups": [
                        {
                            "name_prefix": "n",
                            "product": "H100-80GB",
                            "gpus_per_node": 4,
                            "mig_strategy": "mixed",
                            "mig_layout": {"0-1": "all-balanced", "2": ["7g"]},
                            "mig_config": "split",
                        }
                    ],
                }
            ],
        }
    )
    node = scenario.build().cluster().nodes["n-01"]
    assert [g.layout() for g in node.gpus] == [
        ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
        ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
        ["7g.80gb"],
        [],
    ]
    assert node.labels["nvidia.com/mig.config"] == "split"
    assert len(node.devices["nvidia.com/gpu"]) == 1
    assert scenario.expected_counts()["totals"]["full_gpus"] == {"H100-80GB": 1}


def test_runner_serves_and_writes_kubeconfigs(tmp_path, make_api, capsys):
    stop = threading.Event()
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "rc",
            main(["--scenario", "demo", "--port", "0", "--kubeconfig-dir", str(tmp_path), "--tick", "0.1"], stop=stop),
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "dev.kubeconfig").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        api = make_api(tmp_path / "dev.kubeconfig")
        assert [n.metadata.name for n in api.list_node().items] == ["dev-h200-ts-01", "dev-h200-ts-02"]
    finally:
        stop.set()
        thread.join(10)
    assert result["rc"] == 0
    out = capsys.readouterr().out
    assert "cluster prod: 6 nodes, 48 GPUs" in out and str(tmp_path / "prod.kubeconfig") in out


def test_runner_rejects_unknown_scenarios(capsys):
    assert main(["--scenario", "nope", "--port", "0"]) == 2
    assert "no scenario 'nope'" in capsys.readouterr().err
