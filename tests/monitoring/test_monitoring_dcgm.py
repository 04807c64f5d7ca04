"""DCGM exporter: real-shaped exposition text -> per-GPU and per-MIG-instance samples and health events."""

from datetime import timedelta

import pytest
from monitoring_helpers import T0

from monitoring.adapters import prometheus
from monitoring.ingest import dcgm
from monitoring.models import Collector, HealthEvent, Sample, Series
from monitoring.services.collect import record_dcgm, scrape_cluster

# Shaped like dcgm-exporter 4.5.x output (reference §6): parent UUID on MIG lines, GPU_I_PROFILE and
# GPU_I_ID, Hostname, the driver-version label, pod attributes, XID err_code/err_msg, a blank sentinel.
LABELS0 = (
    'gpu="0",UUID="GPU-0000-aaaa",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"'
)
LABELS1 = (
    'gpu="1",UUID="GPU-0001-bbbb",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3"'
)
DRIVER = 'DCGM_FI_DRIVER_VERSION="550.54.15"'
MIG2 = 'GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="gpu-node-01"'
MIG9 = 'GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="gpu-node-01"'
POD = 'container="main",namespace="team-a",pod="trainer-0"'
XID79 = 'err_code="79",err_msg="GPU has fallen off the bus"'
EXPORTER_TEXT = f"""\
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{LABELS0},Hostname="gpu-node-01",{DRIVER}}} 412.5
DCGM_FI_DEV_POWER_USAGE{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 141.237
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 123456789
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 61
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 9223372036854775794
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 87
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 30000
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 51000
DCGM_FI_DEV_FB_USED{{{LABELS0},{MIG2},{DRIVER},{POD}}} 30123
DCGM_FI_DEV_FB_USED{{{LABELS0},{MIG9},{DRIVER},container="",namespace="",pod=""}} 8543
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 0.64
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{LABELS0},{MIG2},{DRIVER},{POD}}} 0.95
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{LABELS0},{MIG9},{DRIVER}}} 0.25
# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 0.612
# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.
# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 0
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{LABELS0},Hostname="gpu-node-01",{DRIVER}}} 1
# HELP DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS Number of remapped rows for uncorrectable errors
# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 0
# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed
# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge
DCGM_FI_DEV_ROW_REMAP_FAILURE{{{LABELS1},Hostname="gpu-node-01",{DRIVER}}} 0
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{{{LABELS1},Hostname="gpu-node-01",{DRIVER},err_code="0",err_msg="No Error"}} 0
DCGM_FI_DEV_XID_ERRORS{{{LABELS0},Hostname="gpu-node-01",{DRIVER},{XID79}}} 79
"""
# main since 2026-05 prints `hostname`; an unknown GPU must be skipped, not fail the scrape.
NEW_NAMESPACE_TEXT = """\
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-9999-zzzz",device="nvidia0",modelName="NVIDIA H200",hostname="other"} 99.5
"""


def _units():
    return {u.key: u for u in dcgm.readings(prometheus.parse(EXPORTER_TEXT))}


def test_exposition_is_grouped_per_gpu_and_mig_instance():
    units = _units()
    assert sorted(units, key=lambda key: (key[0], key[1] or -1)) == [
        ("GPU-0000-aaaa", None),
        ("GPU-0000-aaaa", 2),
        ("GPU-0000-aaaa", 9),
        ("GPU-0001-bbbb", None),
    ]
    full = units[("GPU-0001-bbbb", None)]
    assert (full.hostname, full.gpu_index, full.mem_total_mib) == ("gpu-node-01", 1, 81000)
    assert full.values == {
        "power_w": 141.237,
        "energy_mj": 123456789,
        "temp_c": 61,
        "gpu_util": 87,
        "mem_used_mib": 51000,
        "sm_active": pytest.approx(61.2),
        "ecc_dbe_vol": 0,
        "remap_unc": 0,
        "remap_failure": False,
        "xid": 0,
    }
    assert full.sm_from_gr_engine is False  # PROF_SM_ACTIVE wins over GR_ENGINE_ACTIVE


def test_mig_lines_use_the_parent_uuid_and_gi_id_and_fall_back_to_gr_engine():
    mig = _units()[("GPU-0000-aaaa", 2)]
    assert (mig.profile, mig.values["mem_used_mib"], mig.values["sm_active"]) == ("3g.40gb", 30123, 95.0)
    assert mig.sm_from_gr_engine is True
    assert "power_w" not in mig.values  # power is per GPU: unavailable here, not zero


def test_blank_sentinels_and_unmapped_fields_are_dropped():
    assert all("memory_temp" not in u.values for u in _units().values())
    assert dcgm._value(9223372036854775794.0, "int") is None
    assert dcgm._value(2147483632.0, "int") is None
    assert dcgm._value(140737488355328.0, "float") is None
    assert dcgm._value(0.5, "ratio") == 50.0


def test_lowercase_hostname_label_is_accepted():
    (unit,) = dcgm.readings(prometheus.parse(NEW_NAMESPACE_TEXT))
    assert (unit.hostname, unit.values) == ("other", {"power_w": 99.5})


def test_garbage_is_a_scrape_error():
    with pytest.raises(prometheus.ScrapeError):
        prometheus.parse('DCGM_FI_DEV_POWER_USAGE{gpu="0" 1\n')


@pytest.mark.django_db
def test_a_scrape_writes_the_same_series_as_nvml_and_raises_health_events(fleet):
    result = record_dcgm(fleet.cluster, list(_units().values()), ts=T0)
    assert (result.gpus, result.mig_instances, result.samples, result.unknown) == (2, 2, 4, [])
    mig3 = Sample.objects.get(series__mig_instance=fleet.mig_3g)
    assert (mig3.sm_active, mig3.mem_used_mib, mig3.power_w) == (95.0, 30123, None)
    parent = Sample.objects.get(series__gpu=fleet.mig_gpu, series__mig_instance__isnull=True)
    # MIG-enabled parent: no GPU-level activity line, and the 2g instance is not exported -> unavailable
    assert (parent.power_w, parent.sm_active, parent.xid) == (412.5, None, 79)
    full = Sample.objects.get(series__gpu=fleet.full_gpu)
    assert (full.gpu_util, full.mem_used_mib, full.energy_mj) == (87, 51000, 123456789)
    assert Series.objects.get(gpu=fleet.full_gpu).mem_total_mib == 81000
    assert Series.objects.get(mig_instance=fleet.mig_3g).source == "dcgm"
    assert sorted(HealthEvent.objects.open().values_list("gpu__uuid", "rule")) == [
        ("GPU-0000-aaaa", "ecc_dbe"),
        ("GPU-0000-aaaa", "xid_critical"),
    ]
    record_dcgm(fleet.cluster, list(_units().values()), ts=T0)  # a repeated scrape: nothing new
    assert Sample.objects.count() == 4


@pytest.mark.django_db
def test_scrape_cluster_fetches_every_url_and_records_failures(fleet):
    fleet.cluster.dcgm_exporter_url = "http://a:9400/metrics, http://b:9400/metrics"
    fleet.cluster.save()

    def fetch(url, timeout_s):
        if url.startswith("http://b"):
            raise prometheus.ScrapeError(f"{url}: connection refused")
        return EXPORTER_TEXT + NEW_NAMESPACE_TEXT

    result = scrape_cluster(fleet.cluster.pk, at=T0 + timedelta(seconds=5), fetch=fetch)
    assert result.samples == 4
    assert result.unknown == ["GPU-9999-zzzz"]
    assert result.error == "http://b:9400/metrics: connection refused"
    assert Sample.objects.filter(ts=T0).count() == 4  # slot time: floored to the poll period
    collectors = dict(Collector.objects.values_list("target", "last_error"))
    assert collectors == {
        "http://a:9400/metrics": "",
        "http://b:9400/metrics": "http://b:9400/metrics: connection refused",
    }
