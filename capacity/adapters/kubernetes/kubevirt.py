"""The KubeVirt CR's permitted host devices (kubevirt.io/v1 `KubeVirt`, spec.configuration.permittedHostDevices).

KubeVirt lets a VirtualMachineInstance use a mediated device (a vGPU) only when the cluster's KubeVirt CR lists
its resource under `spec.configuration.permittedHostDevices.mediatedDevices[]`: `mdevNameSelector` (the mdev
type's name, "NVIDIA H100XM-20C"), `resourceName` (the extended resource, `nvidia.com/NVIDIA_H100XM-20C`) and
`externalResourceProvider: true` when another device plugin advertises the devices, as NVIDIA's
kubevirt-gpu-device-plugin (the GPU Operator's sandbox device plugin) does: kubevirt/kubevirt docs/host-devices.md
("Permitting Host Devices to be used in the cluster"), NVIDIA/kubevirt-gpu-device-plugin README.md, and
NVIDIA's GPU Operator "GPU Operator with KubeVirt" page (which has the operator add these entries by hand).

The list is atomic in KubeVirt's CRD, so an apply of gpuaas's entries alone would drop everyone else's: the CR is
read, the missing entries appended to what it holds, and the whole list applied with the CR's resourceVersion
(a concurrent edit is a Conflict; the caller's retry reads again). Idempotent: nothing is written when every
entry is there already.
"""

from __future__ import annotations

from .errors import Invalid, NotFound
from .transport import Transport

API_VERSION = "kubevirt.io/v1"
KIND = "KubeVirt"


class KubevirtCalls(Transport):
    def kubevirt_cr(self) -> dict:
        """The cluster's KubeVirt CR (the first, by namespace and name; KubeVirt runs one). Invalid when
        KubeVirt is not installed (the kind is not served, or no CR exists)."""
        try:
            listing = self._raw("list KubeVirt", "GET", f"/apis/{API_VERSION}/kubevirts")
        except NotFound:
            listing = {}
        items = sorted(
            listing.get("items") or (),
            key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]),
        )
        if not items:
            raise Invalid(f"{self.host} has no KubeVirt CR: install KubeVirt to run VMs", status=None)
        return items[0]

    def permit_mediated_devices(self, entries: list[dict]) -> bool:
        """Make sure the KubeVirt CR permits these mediated devices (by resourceName); True if it was changed."""
        cr = self.kubevirt_cr()
        meta = cr["metadata"]
        permitted = ((cr.get("spec") or {}).get("configuration") or {}).get("permittedHostDevices") or {}
        current = list(permitted.get("mediatedDevices") or [])
        names = {d.get("resourceName") for d in current if isinstance(d, dict)}
        missing = [e for e in entries if e["resourceName"] not in names]
        if not missing:
            return False
        self.apply_object(
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta.get("namespace", ""),
                    "resourceVersion": meta.get("resourceVersion", ""),
                },
                "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": current + missing}}},
            },
            force=True,  # the list is atomic: take it over, with everyone's entries in it
        )
        return True
