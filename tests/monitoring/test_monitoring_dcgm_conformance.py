"""DCGM exporter, real shape: a MIG GPU sends per-instance lines only (tests/fixtures/dcgm/).

The parser is checked against a recorded exporter capture, the simulator's exporter endpoint against the
same capture and dcgm-exporter's default-counters.csv, and the whole scrape (HTTP, parse, record, health)
against the simulator: device-level fields once per GPU, one XID once, per-instance fields per instance.
"""

import re
from pathlib import Path

import pytest
from monitoring_helpers import T0
from monitoring_sim import start
from prometheus_client.parser import text_string_to_metric_families

from monitoring.adapters import prometheus
from monitoring.ingest import dcgm
from monitoring.models import HealthEvent, Sample
from monitoring.services.collect import scrape_cluster
from simcluster import SimServer
from simcluster.scenarios import Scenario

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dcgm"
CAPTURE = (FIXTURES / "a800-mig-per-instance.prom").read_text()
MIG_GPU = "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418"
FULL_GPU = "GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6"
_LINE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _csv_types() -> dict[str, str]:
    types = {}
    for line in (FIXTURES / "default-counters.csv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind, _ = (part.strip() for part in line.split(",", 2))
            types[name] = kind
    return types


def _lines(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(family, labels in the order written) of every sample line."""
    return [
        (m.group(1), _LABEL.findall(m.group(2)))
        for line in text.splitlines()
        if not line.startswith("#") and (m := _LINE.match(line))
    ]


def _mig_families(text: str) -> set[str]:
    return {name for name, labels in _lines(text) if "GPU_I_ID" in dict(labels)}


def test_recorded_capture_mig_gpu_device_fields_are_recorded_once_on_the_gpu():
    units = {u.key: u for u in dcgm.readings(prometheus.parse(CAPTURE))}
    assert sorted(units, key=lambda k: (k[0], k[1] or -1)) == [
        (MIG_GPU, None),
        (MIG_GPU, 3),
        (MIG_GPU, 5),
        (MIG_GPU, 6),
        (FULL_GPU, None),
    ]
    gpu = units[(MIG_GPU, None)]
    # from the first instance line (GI 3); GI 6's 78.446 W is the same quantity read a moment later
    assert (gpu.hostname, gpu.gpu_index) == ("msxf-hpc-64-35-ai", 0)
    assert gpu.values == {"power_w": 78.174, "energy_mj": 257858316, "temp_c": 33, "xid": 0}
    for gi in (3, 5, 6):
        assert units[(MIG_GPU, gi)].values == {"mem_used_mib": 10, "sm_active": 0.0}
        assert units[(MIG_GPU, gi)].mem_total_mib == 19967
    full = units[(FULL_GPU, None)]
    assert full.values["power_w"] == 55.942 and full.mem_total_mib == 81228


def _served_text() -> str:
    """The simulated exporter's /metrics of a node like the monitoring fleet's, fetched over HTTP."""
    state = Scenario.from_dict(
        {
            "name": "dcgm",
            "seed": 5,
            "clusters": [
                {
                    "name": "dcgm",
                    "node_groups": [
                        {
                            "name_prefix": "h100",
                            "count": 1,
                            "product": "H100-80GB",
                            "gpus_per_node": 2,
                            "mig_strategy": "mixed",
                            "mig_layout": {"0": ["3g.40gb", "2g.20gb", "1g.10gb"]},
                        }
                    ],
                }
            ],
        }
    ).build(mig_manager_delay=3600)
    state.tick(30)
    with SimServer(state) as server:
        (url,) = server.dcgm_exporter_urls("dcgm")
        return prometheus.fetch(url, timeout_s=5)


def test_simulator_exporter_matches_the_recorded_shape_and_default_counters():
    text = _served_text()
    types = _csv_types()
    families = list(text_string_to_metric_families(text))
    assert families
    for family in families:
        if family.name in types:  # typed as default-counters.csv types it
            assert family.type == types[family.name], family.name
    lines = _lines(text)
    recorded = {  # label order of the capture's MIG lines and whole-GPU lines
        "GPU_I_ID" in dict(labels): [k for k, _ in labels if k != "DCGM_FI_PROCESS_NAME"]
        for _, labels in _lines(CAPTURE)
    }
    for name, labels in lines:
        keys = [k for k, _ in labels]
        mig = ["GPU_I_PROFILE", "GPU_I_ID"] if "GPU_I_ID" in keys else []
        head = ["gpu", "UUID", "pci_bus_id", "device", "modelName", *mig, "Hostname", "DCGM_FI_DRIVER_VERSION"]
        assert keys[: len(head)] == head, name
        order = recorded[bool(mig)]
        assert [k for k in keys if k in order] == order, name  # the capture predates pci_bus_id
    mig_uuids = {dict(labels)["UUID"] for _, labels in lines if "GPU_I_ID" in dict(labels)}
    whole = {dict(labels)["UUID"] for _, labels in lines if "GPU_I_ID" not in dict(labels)}
    assert mig_uuids and whole and not mig_uuids & whole  # no whole-GPU line for a MIG GPU
    # The same families on MIG lines as the real exporter, plus the ECC totals this simulator's collectors
    # enable and NVLink bandwidth (cut from the trimmed capture); none of the whole-GPU-only ones.
    served = {n for n in _mig_families(text) if "_ECC_" not in n} - {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}
    assert served == _mig_families(CAPTURE)


@pytest.mark.django_db
def test_scraping_the_simulated_exporter_records_device_fields_once_and_one_xid(tmp_path):
    sim = start(tmp_path)
    try:
        sim.cluster.dcgm_exporter_url = ", ".join(sim.server.dcgm_exporter_urls(sim.name))
        sim.cluster.save()
        sim.state.tick(30)
        sim.faults.xid(sim.name, "h100-01", 0, code=48)  # one GPU-level XID on the MIG GPU
        result = scrape_cluster(sim.cluster.pk, at=T0)
    finally:
        sim.server.stop()
    assert (result.error, result.unknown) == ("", [])
    mig_gpu = sim.gpu("h100-01", 0)
    parent = Sample.objects.get(series__gpu=mig_gpu, series__mig_instance__isnull=True)
    assert parent.power_w is not None and parent.energy_mj is not None and parent.temp_c is not None
    assert parent.xid == 48
    for profile in ("3g.40gb", "2g.20gb", "1g.10gb"):
        unit = Sample.objects.get(series__mig_instance=sim.instance("h100-01", profile))
        assert (unit.power_w, unit.xid) == (None, None)
        assert unit.mem_used_mib is not None and unit.sm_active is not None
    events = HealthEvent.objects.open().filter(gpu=mig_gpu, rule="xid_critical")
    assert list(events.values_list("mig_instance", flat=True)) == [None]
