"""The Kubernetes adapter's DRA parsing against the recorded ResourceSlices of NVIDIA's driver (tests/fixtures/dra)."""

from __future__ import annotations

from pathlib import Path

import yaml

from capacity.adapters.kubernetes import parse_pod, parse_resource_claim, parse_resource_slice
from capacity.services.workloads import dra_resource_name

FIXTURE = Path(__file__).parent.parent / "fixtures" / "dra" / "nvidia-resourceslices-a100.yaml"


def test_parses_the_drivers_whole_gpu_and_mig_devices():
    slices = yaml.safe_load(FIXTURE.read_text())["items"]
    gpu, mig = (device for obj in slices for device in parse_resource_slice(obj))
    assert (gpu.driver, gpu.pool, gpu.node_name, gpu.name, gpu.type, gpu.uuid) == (
        "gpu.nvidia.com",
        "aks-gpupool-15127565-vmss000002",
        "aks-gpupool-15127565-vmss000002",
        "gpu-1",
        "gpu",
        "GPU-13719f71-412c-d11e-b236-a262f530a4fc",
    )
    assert (gpu.product_name, gpu.memory, gpu.profile, gpu.parent_uuid) == ("NVIDIA A100 80GB PCIe", "80Gi", "", "")
    assert (mig.name, mig.type, mig.profile, mig.parent_uuid) == (
        "gpu-0-mig-19-0-1",
        "mig",
        "1g.10gb",
        "GPU-ddf64803-f421-0e5b-883e-cd752de16db7",
    )
    assert (dra_resource_name(gpu), dra_resource_name(mig)) == ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb")


def test_a_device_without_uuid_is_skipped():
    obj = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "n"},
            "devices": [{"name": "imex-channel-0", "attributes": {"type": {"string": "channel"}}}],
        }
    }
    assert parse_resource_slice(obj) == []


def test_claim_and_pod_references():
    claim = parse_resource_claim(
        {
            "metadata": {"namespace": "team-a", "name": "infer-gpu-x1z2q", "uid": "c1"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "mig",
                                "driver": "gpu.nvidia.com",
                                "pool": "node-1",
                                "device": "gpu-0-mig-9-4-4",
                            }
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": "infer", "uid": "p1"}],
            },
        }
    )
    assert claim.results == (("mig", "gpu.nvidia.com", "node-1", "gpu-0-mig-9-4-4"),)
    assert claim.reserved_for == ("p1",)
    pod = parse_pod(
        {
            "metadata": {"namespace": "team-a", "name": "infer", "uid": "p1"},
            "spec": {
                "resourceClaims": [
                    {"name": "gpu", "resourceClaimTemplateName": "gpuaas-1-mig-3g.40gb"},
                    {"name": "shared", "resourceClaimName": "team-claim"},
                ]
            },
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "infer-gpu-x1z2q"}]},
        }
    )
    assert (pod.claims, pod.requests) == (["team-claim", "infer-gpu-x1z2q"], {})
