"""What the NVIDIA GPU Operator's components do to a node, per ../shared/reference/nvidia.md.

- GPU Feature Discovery (§5, device-plugin `internal/lm`): the `nvidia.com/*` labels,
  including per-profile MIG labels under the mixed strategy, `<model>-MIG-<profile>` /
  `-MIG-INVALID` under single, and sharing labels (`.replicas`, `.sharing-strategy`,
  `-SHARED`).
- The device plugin (§3 strategies, §4 sharing): the extended resources a node advertises,
  as device-ID lists: GPU UUIDs, MIG UUIDs, or `<uuid>::<n>` time-slice replicas. Capacity
  counts every device, allocatable only healthy ones (a lost GPU drops out of allocatable;
  its GFD labels stay until the next relabel, as GFD would only notice on restart).
- The MIG manager (§3, reconfigure-mig.sh): reacts to a changed `nvidia.com/mig.config` label
  by reading the config from its mounted copy of the ConfigMap, which kubelet refreshes
  `SimState.configmap_sync_delay` seconds after a change: a config missing there -> `failed` at
  once; already applied (mig-parted assert) -> `success` at once, nothing drained; otherwise
  state `pending`, deploy labels paused, then after `SimState.mig_manager_delay` seconds (or at
  once via `SimState.run_mig_manager()`) -> `rebooting` first when a GPU's MIG mode must change
  and `SimState.mig_mode_reboot` is on (the apply follows one more delay later), then applies
  -> `success`, or `failed` when the config is invalid for the GPUs, a GPU is lost, or GPU pods
  run on the node.
- The device plugin's pod (§3 step 5, `app=nvidia-device-plugin-daemonset`), with
  `SimState.device_plugin_restart` on: one per GPU node in the operator namespace; the plugin
  keeps the resource list it registered at start (a direct NVML MIG change does not reach
  allocatable) until the pod is deleted and its DaemonSet recreates it, or the MIG manager
  restarts it.

MIG-parted config lookup order (first ConfigMap that exists in the operator namespace,
key `config.yaml`, is the only one read, as the real manager reads exactly one file):
  1. `gpuaas-mig-parted-config` - gpuaas's own; stands for "gpuaas pointed the ClusterPolicy
     at its ConfigMap";
  2. the ClusterPolicy `spec.migManager.config.name` (`ClusterSettings.mig_config_name`);
  3. `default-mig-parted-config` (seeded from capacity.mig.catalog.named_configs()).
Device-plugin sharing: ConfigMap `ClusterSettings.device_plugin_config_name` (default
`time-slicing-config`), key chosen per node by label `nvidia.com/device-plugin.config`,
else `ClusterSettings.device_plugin_default`; an unknown key leaves the node as it was.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from capacity.mig.catalog import Product, Profile, mig_parted_entries
from capacity.vgpu import VGPU_TYPES, VM_VGPU, WORKLOAD_CONFIG_LABEL

from . import dra, vgpudm
from .hardware import HardwareError, plan_layout
from .state import Cluster, MigJob, Node, Sharing

if TYPE_CHECKING:
    from .hardware import Gpu

try:
    _YAML_LOADER = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _YAML_LOADER = yaml.SafeLoader

GPUAAS_MIG_CONFIGMAP = "gpuaas-mig-parted-config"
DEFAULT_MIG_CONFIGMAP = "default-mig-parted-config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
PAUSED = "paused-for-mig-change"
DEVICE_PLUGIN_APP = "nvidia-device-plugin-daemonset"
DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"

# Deploy labels the MIG manager pauses while it reconfigures (reconfigure-mig.sh step 5).
DRAINED_DEPLOY_LABELS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
)
OTHER_DEPLOY_LABELS = (
    "nvidia.com/gpu.deploy.container-toolkit",
    "nvidia.com/gpu.deploy.driver",
    "nvidia.com/gpu.deploy.node-status-exporter",
    "nvidia.com/gpu.deploy.operator-validator",
)

_BASE_CAPACITY = {
    "cpu": "224",
    "ephemeral-storage": "1844284980Ki",
    "hugepages-1Gi": "0",
    "hugepages-2Mi": "0",
    "memory": "2113378836Ki",
    "pods": "110",
}
_BASE_ALLOCATABLE = {**_BASE_CAPACITY, "cpu": "223500m", "ephemeral-storage": "1699708367023", "memory": "2112764436Ki"}


# ----------------------------------------------------------------------------------------
# Cluster bootstrap and the default mig-parted config


@functools.cache
def default_mig_parted_config_yaml() -> str:
    """The document as the ConfigMap holds it (built once per process)."""
    return yaml.safe_dump(default_mig_parted_config(), sort_keys=False)


def default_mig_parted_config() -> dict:
    """The `default-mig-parted-config` document for every catalog product.

    Configs that several products share with identical `mig-devices` become one entry with
    a device-filter listing their PCI ids, as NVIDIA's shipped file does.
    """
    return {"version": "v1", "mig-configs": mig_parted_entries()}


def bootstrap_cluster(cluster: Cluster) -> None:
    """Namespaces and operator ConfigMaps a freshly installed cluster has."""
    from .kube import ClusterApi

    api = ClusterApi(cluster)
    for ns in ("default", "kube-node-lease", "kube-public", "kube-system", cluster.settings.operator_namespace):
        api.create("namespaces", None, {"metadata": {"name": ns}})
    ns = cluster.settings.operator_namespace
    api.create(
        "configmaps",
        ns,
        {
            "metadata": {"name": DEFAULT_MIG_CONFIGMAP, "labels": {"app": "nvidia-mig-manager"}},
            "data": {"config.yaml": default_mig_parted_config_yaml()},
        },
    )
    api.create(
        "configmaps",
        ns,
        {
            "metadata": {"name": "default-gpu-clients"},
            "data": {
                "clients.yaml": yaml.safe_dump(
                    {
                        "version": "v1",
                        "systemd-services": [
                            "nvsm.service",
                            "nvsm-mqtt.service",
                            "nvsm-core.service",
                            "nvsm-api-gateway.service",
                            "nvsm-notifier.service",
                            "nv_peer_mem.service",
                            "nvidia-dcgm.service",
                            "dcgm.service",
                            "dcgm-exporter.service",
                        ],
                    },
                    sort_keys=False,
                )
            },
        },
    )
    _mount_now(cluster)
    if cluster.settings.dra:
        dra.bootstrap(cluster)


def add_mig_configs(cluster: Cluster, extra: dict[str, list[dict]]) -> None:
    """Add site configs to `default-mig-parted-config`, as an admin editing it would."""
    record = cluster.configmaps[(cluster.settings.operator_namespace, DEFAULT_MIG_CONFIGMAP)]
    document = yaml.load(record.obj["data"]["config.yaml"], Loader=_YAML_LOADER)
    document["mig-configs"].update(extra)
    record.obj["data"]["config.yaml"] = yaml.safe_dump(document, sort_keys=False)
    record.obj["metadata"]["resourceVersion"] = cluster.bump()
    record.raw = None
    cluster.record_event("MODIFIED", "configmaps", (cluster.settings.operator_namespace, DEFAULT_MIG_CONFIGMAP), record)
    _mount_now(cluster)


def _mount_now(cluster: Cluster) -> None:
    """Set-up writes (cluster bootstrap, scenario configs) are in the manager's mounted copy from its start."""
    for (namespace, name), record in cluster.configmaps.items():
        if namespace == cluster.settings.operator_namespace:
            cluster.mounted[name] = [(float("-inf"), (record.obj.get("data") or {}).get("config.yaml"))]


def record_configmap_change(cluster: Cluster, name: str) -> None:
    """Kubelet refreshes a mounted ConfigMap on its sync period: the change reaches the MIG manager's
    copy configmap_sync_delay seconds from now (a deleted ConfigMap stays mounted until then too)."""
    now = time.monotonic()
    history = cluster.mounted.setdefault(name, [])
    visible = [i for i, (at, _) in enumerate(history) if at <= now]
    if visible:
        del history[: visible[-1]]  # keep the copy mounted now and the changes still on their way
    history.append((now + cluster.state.configmap_sync_delay, _configmap_text(cluster, name, "config.yaml")))


def mounted_config_text(cluster: Cluster, name: str | None) -> str | None:
    """config.yaml of ConfigMap `name` as the MIG manager's mounted copy holds it now (None: not mounted)."""
    now = time.monotonic()
    text = None
    for at, value in cluster.mounted.get(name or "", ()):
        if at > now:
            break
        text = value
    return text


# ----------------------------------------------------------------------------------------
# Config parsing (cached by content: 2,000 nodes share one parse; str caches its own hash)

_parsed_cache: dict[tuple[object, str], tuple[object, str | None]] = {}


def _configmap_text(cluster: Cluster, name: str | None, key: str) -> str | None:
    if not name:
        return None
    record = cluster.configmaps.get((cluster.settings.operator_namespace, name))
    if record is None:
        return None
    return (record.obj.get("data") or {}).get(key)


def _cached_parse(text: str, parser):
    """(parsed, None) or (None, error message); memoised on the document text."""
    cache_key = (parser, text)
    if cache_key not in _parsed_cache:
        if len(_parsed_cache) > 256:
            _parsed_cache.clear()
        try:
            _parsed_cache[cache_key] = (parser(text), None)
        except (ValueError, TypeError, AttributeError, yaml.YAMLError) as exc:
            _parsed_cache[cache_key] = (None, str(exc))
    return _parsed_cache[cache_key]


def parse_mig_parted(text: str) -> dict[str, list[dict]]:
    """Validate a mig-parted v1 document (api/spec/v1/spec.go rules); return mig-configs."""
    doc = yaml.load(text, Loader=_YAML_LOADER)
    if not isinstance(doc, dict):
        raise ValueError("config is not a YAML mapping")
    unknown = set(doc) - {"version", "mig-configs"}
    if unknown:
        raise ValueError(f"unexpected field: {sorted(unknown)[0]}")
    if doc.get("version") != "v1":
        raise ValueError(f"unknown version: {doc.get('version')!r}" if "version" in doc else "missing version field")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise ValueError("missing or empty mig-configs field")
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"mig-config {name!r} must be a non-empty list")
        for entry in entries:
            if not isinstance(entry, dict):
                raise ValueError(f"mig-config {name!r}: entries must be mappings")
            extra = set(entry) - {"device-filter", "devices", "mig-enabled", "mig-devices"}
            if extra:
                raise ValueError(f"unexpected field: {sorted(extra)[0]}")
            devices = entry.get("devices")
            if devices != "all" and not (isinstance(devices, list) and all(isinstance(d, int) for d in devices)):
                raise ValueError(f"mig-config {name!r}: devices must be 'all' or a list of GPU indices")
            if not isinstance(entry.get("mig-enabled"), bool):
                raise ValueError(f"mig-config {name!r}: missing mig-enabled")
            mig_devices = entry.get("mig-devices") or {}
            if not isinstance(mig_devices, dict) or not all(
                isinstance(v, int) and v >= 0 for v in mig_devices.values()
            ):
                raise ValueError(f"mig-config {name!r}: mig-devices must map profile names to counts")
    return configs


def mig_config_source(cluster: Cluster) -> tuple[str, str] | None:
    """(ConfigMap name, config.yaml text) the MIG manager reads from its mounted copy; see module docstring."""
    for name in (GPUAAS_MIG_CONFIGMAP, cluster.settings.mig_config_name, DEFAULT_MIG_CONFIGMAP):
        text = mounted_config_text(cluster, name)
        if text is not None:
            return name, text
    return None


def parse_device_plugin_config(text: str) -> Sharing | None:
    """device-plugin config v1 -> the sharing it asks for (None = no replicated resource)."""
    doc = yaml.load(text, Loader=_YAML_LOADER) or {}
    if not isinstance(doc, dict):
        raise ValueError("device plugin config is not a mapping")
    if doc.get("version", "v1") != "v1":
        raise ValueError(f"unknown version {doc.get('version')!r}")
    sharing = doc.get("sharing") or {}
    for strategy, key in (("mps", "mps"), ("time-slicing", "timeSlicing")):
        section = sharing.get(key) or {}
        replicas = {}
        for res in section.get("resources") or []:
            name = str(res.get("name", ""))
            if "/" not in name:
                name = "nvidia.com/" + name
            count = int(res.get("replicas", 1))
            if count < 1:
                raise ValueError(f"replicas for {name} must be >= 1")
            if count > 1:
                replicas[name] = count
        if replicas:
            # MPS: failRequestsGreaterThanOne is true when unset (NVIDIA/k8s-device-plugin api/config/v1/config.go).
            refuse_default = strategy == "mps"
            return Sharing(
                strategy=strategy,
                replicas=replicas,
                rename_by_default=bool(section.get("renameByDefault", False)),
                fail_requests_greater_than_one=bool(section.get("failRequestsGreaterThanOne", refuse_default)),
            )
    return None


# ----------------------------------------------------------------------------------------
# Device plugin: advertised devices and node resources


def mig_resource_name(profile: Profile, strategy: str) -> str:
    return "nvidia.com/gpu" if strategy == "single" else profile.resource_name


def _single_strategy_state(gpus: list[Gpu]) -> str:
    """none (no MIG GPUs) | valid | invalid, as GFD's single-strategy labeler decides."""
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return "none"
    if len(enabled) != len(gpus) or any(not g.mig_devices() for g in enabled):
        return "invalid"
    names = {gi.profile.name for g in enabled for gi, ci in g.mig_devices() if ci.slices == gi.profile.compute_slices}
    partial = any(ci.slices != gi.profile.compute_slices for g in enabled for gi, ci in g.mig_devices())
    return "valid" if len(names) == 1 and not partial else "invalid"


def advertised_devices(node: Node) -> dict[str, list[tuple[str, bool]]]:
    """resource name -> [(device id, healthy)] the device plugin registers for the node."""
    vgpus = _vgpu_devices(node)
    if vgpus is not None:
        return vgpus
    strategy = node.mig_strategy
    raw: dict[str, list[tuple[str, bool]]] = {}

    def add(resource: str, device_id: str, gpu: Gpu) -> None:
        raw.setdefault(resource, []).append((device_id, not gpu.lost))

    single = _single_strategy_state(node.gpus) if strategy == "single" else None
    for gpu in node.gpus:
        if strategy == "none" or single == "none" or (strategy == "mixed" and not gpu.mig_enabled):
            add("nvidia.com/gpu", gpu.uuid, gpu)
        elif strategy == "mixed" or single == "valid":
            for gi, ci in gpu.mig_devices():
                if ci.slices == gi.profile.compute_slices:
                    add(mig_resource_name(gi.profile, strategy), ci.uuid, gpu)
    if node.sharing is None:
        return raw
    shared: dict[str, list[tuple[str, bool]]] = {}
    for resource, devices in raw.items():
        replicas = node.sharing.replicas_for(resource)
        if replicas <= 1:
            shared[resource] = devices
            continue
        # Replica-major order spreads consecutive allocations over physical devices.
        shared[node.sharing.advertised_name(resource)] = [
            (f"{device_id}::{n}", healthy) for n in range(replicas) for device_id, healthy in devices
        ]
    return shared


def _vgpu_devices(node: Node) -> dict[str, list[tuple[str, bool]]] | None:
    """A vm-vgpu node (nvidia.com/gpu.workload.config=vm-vgpu): the vGPU device manager carves every GPU
    into the vGPUs of the type nvidia.com/vgpu.config names (once applied: simcluster.vgpudm), and the sandbox
    device plugin advertises them
    as nvidia.com/NVIDIA_<type> (no nvidia.com/gpu). None for any other node."""
    labels = node.labels or {}
    if labels.get(WORKLOAD_CONFIG_LABEL) != VM_VGPU:
        return None
    vgpu = VGPU_TYPES.get(vgpudm.applied_type(node))
    if vgpu is None:
        return {}
    return {
        vgpu.resource_name: [
            (f"{gpu.uuid}::vgpu-{n}", not gpu.lost) for gpu in node.gpus for n in range(vgpu.max_per_gpu)
        ]
    }


def refresh_devices(cluster: Cluster, node: Node) -> None:
    """The device plugin registers the node's devices; under DRA it is off and the DRA driver publishes them."""
    devices = {} if cluster.settings.dra else advertised_devices(node)
    node.devices = {res: [d for d, healthy in lst if healthy] for res, lst in devices.items()}
    node.device_capacity = {res: len(lst) for res, lst in devices.items()}
    node.known_resources |= set(devices)
    cluster.touch(node)
    dra.publish(cluster, node)


def node_resources(node: Node) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable); a resource that stopped being advertised stays at "0", as
    kubelet keeps extended resources of a plugin that went away."""
    capacity = dict(_BASE_CAPACITY)
    allocatable = dict(_BASE_ALLOCATABLE)
    for resource in sorted(node.known_resources):
        capacity[resource] = str(node.device_capacity.get(resource, 0))
        allocatable[resource] = str(len(node.devices.get(resource, ())))
    return capacity, allocatable


# ----------------------------------------------------------------------------------------
# GPU Feature Discovery


def _sanitise(text: str) -> str:
    keep = "".join(c for c in text if c.isalnum() or c in "-_. ")
    return "-".join(keep.split())


def _resource_labels(prefix: str, product: str, count: int, replicas: int, sharing: Sharing | None) -> dict[str, str]:
    shared = replicas > 1
    renamed = shared and sharing is not None and sharing.rename_by_default
    return {
        f"{prefix}.product": product + ("-SHARED" if shared and not renamed else ""),
        f"{prefix}.count": str(count),
        f"{prefix}.replicas": str(replicas),
        f"{prefix}.sharing-strategy": sharing.strategy if shared and sharing is not None else "none",
    }


def _mig_attribute_labels(prefix: str, profile: Profile) -> dict[str, str]:
    return {
        f"{prefix}.memory": str(profile.memory_mib),
        f"{prefix}.multiprocessors": str(profile.multiprocessors),
        f"{prefix}.slices.gi": str(profile.compute_slices),
        f"{prefix}.slices.ci": str(profile.compute_slices),
        f"{prefix}.engines.copy": str(profile.copy_engines),
        f"{prefix}.engines.decoder": str(profile.decoders),
        f"{prefix}.engines.encoder": str(profile.encoders),
        f"{prefix}.engines.jpeg": str(profile.jpegs),
        f"{prefix}.engines.ofa": str(profile.ofas),
    }


def gfd_labels(cluster: Cluster, node: Node) -> dict[str, str]:
    """Every label GPU Feature Discovery would write for the node now."""
    settings = cluster.settings
    drv = (settings.driver_version.split(".") + ["", "", ""])[:3]
    cuda = (settings.cuda_version.split(".") + ["", ""])[:2]
    labels = {
        "nvidia.com/gfd.timestamp": str(cluster.state.epoch()),
        "nvidia.com/cuda.driver.major": drv[0],
        "nvidia.com/cuda.driver.minor": drv[1],
        "nvidia.com/cuda.driver.rev": drv[2],
        "nvidia.com/cuda.driver-version.major": drv[0],
        "nvidia.com/cuda.driver-version.minor": drv[1],
        "nvidia.com/cuda.driver-version.revision": drv[2],
        "nvidia.com/cuda.driver-version.full": settings.driver_version,
        "nvidia.com/cuda.runtime.major": cuda[0],
        "nvidia.com/cuda.runtime.minor": cuda[1],
        "nvidia.com/cuda.runtime-version.major": cuda[0],
        "nvidia.com/cuda.runtime-version.minor": cuda[1],
        "nvidia.com/cuda.runtime-version.full": settings.cuda_version,
        "nvidia.com/gpu.machine": _sanitise(settings.machine),
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mps.capable": "false",
    }
    if not node.gpus:
        return labels
    labels["nvidia.com/mig.capable"] = "true" if node.gpus[0].product.profiles else "false"
    strategy = node.mig_strategy
    if strategy != "none":
        labels["nvidia.com/mig.strategy"] = strategy
    sharing = node.sharing
    # Full-GPU labels, one set per model name (scenario nodes are homogeneous).
    by_model: dict[str, list[Gpu]] = {}
    for gpu in node.gpus:
        by_model.setdefault(gpu.name, []).append(gpu)
    for model in sorted(by_model):
        gpus = by_model[model]
        product = gpus[0].product
        has_full = any(not g.mig_enabled for g in gpus)
        replicas = (sharing.replicas_for("nvidia.com/gpu") if sharing else 1) if has_full else 0
        labels.update(
            _resource_labels("nvidia.com/gpu", _sanitise(model), len(gpus), replicas, sharing if has_full else None)
        )
        labels.update(
            {
                "nvidia.com/gpu.memory": str(product.memory_mib),
                "nvidia.com/gpu.family": product.family,
                "nvidia.com/gpu.compute.major": str(product.compute_major),
                "nvidia.com/gpu.compute.minor": str(product.compute_minor),
            }
        )
    model = node.gpus[0].name
    if strategy == "single":
        state = _single_strategy_state(node.gpus)
        if state == "invalid":
            labels.update(
                {
                    "nvidia.com/gpu.product": f"{_sanitise(model)}-MIG-INVALID",
                    "nvidia.com/gpu.count": "0",
                    "nvidia.com/gpu.replicas": "0",
                    "nvidia.com/gpu.memory": "0",
                }
            )
        elif state == "valid":
            migs = [gi for g in node.gpus for gi, _ in g.mig_devices()]
            profile = migs[0].profile
            replicas = sharing.replicas_for("nvidia.com/gpu") if sharing else 1
            labels.update(
                _resource_labels(
                    "nvidia.com/gpu", f"{_sanitise(model)}-MIG-{profile.resource_suffix}", len(migs), replicas, sharing
                )
            )
            labels.update(_mig_attribute_labels("nvidia.com/gpu", profile))
    elif strategy == "mixed":
        counts: dict[str, tuple[Profile, int]] = {}
        for gpu in node.gpus:
            for gi, ci in gpu.mig_devices():
                if ci.slices == gi.profile.compute_slices:
                    p, n = counts.get(gi.profile.name, (gi.profile, 0))
                    counts[gi.profile.name] = (p, n + 1)
        for profile, count in counts.values():
            resource = profile.resource_name
            replicas = sharing.replicas_for(resource) if sharing else 1
            labels.update(
                _resource_labels(
                    resource, f"{_sanitise(model)}-MIG-{profile.resource_suffix}", count, replicas, sharing
                )
            )
            labels.update(_mig_attribute_labels(resource, profile))
    return labels


def relabel(cluster: Cluster, node: Node) -> None:
    """Replace the labels GFD wrote last time with the current set."""
    labels = gfd_labels(cluster, node)
    for key in node.gfd_keys - labels.keys():
        node.labels.pop(key, None)
    node.labels.update(labels)
    node.gfd_keys = set(labels)
    cluster.touch(node)


def refresh_node(cluster: Cluster, node: Node) -> None:
    """Device plugin + GFD pass: allocatable and labels from the node's GPUs now."""
    if cluster.state.device_plugin_restart and node.device_plugin_pod is None:
        ensure_device_plugin_pod(cluster, node)
    refresh_devices(cluster, node)
    relabel(cluster, node)


# ----------------------------------------------------------------------------------------
# Node setup (scenarios) and reactions to API writes


def operator_labels(node: Node) -> dict[str, str]:
    """Labels the operator itself (not GFD) puts on a GPU node."""
    labels = {"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"}
    for key in DRAINED_DEPLOY_LABELS + OTHER_DEPLOY_LABELS:
        labels[key] = "true"
    if node.gpus and node.gpus[0].product.profiles:
        labels["nvidia.com/gpu.deploy.mig-manager"] = "true"
    return labels


def resolve_sharing(cluster: Cluster, node: Node) -> None:
    settings = cluster.settings
    key = node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL) or settings.device_plugin_default
    if key is None:
        node.sharing, node.sharing_key = None, None
        return
    text = _configmap_text(cluster, settings.device_plugin_config_name, key)
    if text is None:
        return  # unknown config key: the plugin skips reconfiguration
    sharing, error = _cached_parse(text, parse_device_plugin_config)
    if error is None:
        node.sharing, node.sharing_key = sharing, key


def on_node_labels_changed(cluster: Cluster, node: Node, old: dict[str, str]) -> None:
    if node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL) != old.get(DEVICE_PLUGIN_CONFIG_LABEL):
        resolve_sharing(cluster, node)
        refresh_node(cluster, node)
    wanted = node.labels.get(MIG_CONFIG_LABEL)
    if wanted and wanted != old.get(MIG_CONFIG_LABEL) and node.gpus:
        request_mig_config(cluster, node, wanted)
    vgpudm.on_label_changed(cluster, node, old)


def on_configmap_changed(cluster: Cluster, namespace: str, name: str) -> None:
    """Kubelet refreshes the MIG manager's mounted copy later; the device plugin's config-manager
    sidecar re-reads its ConfigMap on change."""
    if namespace != cluster.settings.operator_namespace:
        return
    record_configmap_change(cluster, name)
    if name != cluster.settings.device_plugin_config_name:
        return
    for node in cluster.nodes.values():
        if node.gpus and (node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL) or cluster.settings.device_plugin_default):
            before = (node.sharing, node.sharing_key)
            resolve_sharing(cluster, node)
            if (node.sharing, node.sharing_key) != before:
                refresh_node(cluster, node)


# ----------------------------------------------------------------------------------------
# MIG manager


def request_mig_config(cluster: Cluster, node: Node, config: str) -> None:
    """reconfigure-mig.sh steps 1-5 on a changed label: validate against the mounted config, assert,
    then `pending` and drain GPU clients; the apply runs as a job (run_due_jobs)."""
    node.mig_job = None
    wanted, message = resolve_mig_config(cluster, node, config)
    if wanted is None:
        _finish(cluster, node, False, message)
        return
    if _already_applied(wanted):
        _finish(cluster, node, True, f"{config!r} is already applied (mig-parted assert); nothing to do")
        return
    node.labels[MIG_STATE_LABEL] = "pending"
    for key in DRAINED_DEPLOY_LABELS:
        if node.labels.get(key) == "true":
            node.labels[key] = PAUSED
    node.mig_job = MigJob(config=config, due=time.monotonic() + cluster.state.mig_manager_delay)
    cluster.touch(node)


def _finish(cluster: Cluster, node: Node, ok: bool, message: str) -> None:
    """Step 8: state success/failed, deploy labels restored (the device plugin pod comes back)."""
    node.mig_message = message
    node.labels[MIG_STATE_LABEL] = "success" if ok else "failed"
    paused = [key for key in DRAINED_DEPLOY_LABELS if node.labels.get(key) == PAUSED]
    for key in paused:
        node.labels[key] = "true"
    if not cluster.state.device_plugin_restart:
        refresh_node(cluster, node)
        return
    if paused:  # the drained plugin's pod comes back and registers what the GPUs have now
        restart_device_plugin(cluster, node)
    relabel(cluster, node)


def run_due_jobs(cluster: Cluster, now: float, *, force: bool) -> int:
    """Run the pending MIG jobs, and the vGPU device manager's (simcluster.vgpudm), that are due (all with force);
    returns how many ran.

    A job whose config changes a GPU's MIG mode first passes through `rebooting` (with
    SimState.mig_mode_reboot) and applies one mig_manager_delay later, after the "reboot"."""
    recreated = vgpudm.run_due(cluster, now, force=force)
    for node in recreated:
        refresh_node(cluster, node)
    ran = len(recreated)
    for node in list(cluster.nodes.values()):
        job = node.mig_job
        if job is None or not (force or job.due <= now):
            continue
        node.mig_job = None
        ran += 1
        wanted, message = resolve_mig_config(cluster, node, job.config)
        if wanted is None:
            _finish(cluster, node, False, message)
            continue
        mode_change = any(gpu.mig_current != enabled for gpu, enabled, _ in wanted)
        if mode_change and cluster.state.mig_mode_reboot and not job.rebooting:
            node.labels[MIG_STATE_LABEL] = "rebooting"
            node.mig_message = f"rebooting {node.name} to change the MIG mode for {job.config!r}"
            node.mig_job = MigJob(config=job.config, due=now + cluster.state.mig_manager_delay, rebooting=True)
            cluster.touch(node)
            continue
        ok, message = apply_mig_config(cluster, node, job.config)
        _finish(cluster, node, ok, message)
    if ran:
        from . import scheduler

        scheduler.retry_pending(cluster)
    return ran


# ----------------------------------------------------------------------------------------
# Device plugin pods (SimState.device_plugin_restart)


def ensure_device_plugin_pod(cluster: Cluster, node: Node) -> None:
    """The DaemonSet's pod on a GPU node whose deploy label is true (created through the API, so it
    lists, watches and deletes like any pod). The plugin registers the node's devices as it starts."""
    from .kube import ClusterApi

    if not node.gpus or node.labels.get("nvidia.com/gpu.deploy.device-plugin") != "true":
        return
    if node.device_plugin_pod and (cluster.settings.operator_namespace, node.device_plugin_pod) in cluster.pods:
        return
    name = f"{DEVICE_PLUGIN_APP}-{cluster.new_uid('device-plugin', node.name)[-5:]}"
    ClusterApi(cluster).create(
        "pods",
        cluster.settings.operator_namespace,
        {
            "metadata": {
                "name": name,
                "labels": {"app": DEVICE_PLUGIN_APP, "app.kubernetes.io/part-of": "nvidia-gpu"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": DEVICE_PLUGIN_APP,
                        "uid": cluster.new_uid("daemonset"),
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node.name,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "nvidia-device-plugin", "image": DEVICE_PLUGIN_IMAGE}],
            },
        },
    )
    node.device_plugin_pod = name
    refresh_devices(cluster, node)


def restart_device_plugin(cluster: Cluster, node: Node) -> None:
    """The plugin's pod is replaced: the new one registers the devices the node has now."""
    from .kube import ClusterApi

    namespace, old = cluster.settings.operator_namespace, node.device_plugin_pod
    if old and (namespace, old) in cluster.pods:
        ClusterApi(cluster).delete("pods", namespace, old)  # on_pod_deleted: the DaemonSet recreates it
    else:
        node.device_plugin_pod = None
        ensure_device_plugin_pod(cluster, node)


def on_pod_deleted(cluster: Cluster, pod: dict) -> None:
    """The DaemonSet recreates a deleted device plugin pod on its node."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get("app") != DEVICE_PLUGIN_APP:
        return
    node = cluster.nodes.get((pod.get("spec") or {}).get("nodeName", ""))
    if node is not None and node.device_plugin_pod == meta.get("name"):
        node.device_plugin_pod = None
        ensure_device_plugin_pod(cluster, node)


def _entry_matches(entry: dict, gpu: Gpu) -> bool:
    devices = entry.get("devices")
    if devices != "all" and gpu.index not in devices:
        return False
    filters = entry.get("device-filter")
    if filters is None:
        return True
    if isinstance(filters, str):
        filters = [filters]
    return any(int(str(f), 16) == gpu.pci_device_id for f in filters)


def plan_for_gpu(product: Product, mig_devices: dict[str, int]) -> list[tuple[Profile, int]]:
    """Turn a mig-devices map into placements, or raise ValueError naming the problem."""
    profiles: list[Profile] = []
    for name, count in mig_devices.items():
        if str(name).split(".")[0].endswith("c"):
            raise ValueError(f"{name}: compute-instance profiles (<C>c.<G>g) are not simulated")
        try:
            profile = product.profile(str(name))
        except KeyError as exc:
            raise ValueError(str(exc).strip('"')) from None
        profiles.extend([profile] * count)
    plan = plan_layout(product, profiles)
    if plan is None:
        raise ValueError(f"{product.key}: layout {dict(mig_devices)} does not fit on one GPU")
    return plan


def resolve_mig_config(
    cluster: Cluster, node: Node, config: str
) -> tuple[list[tuple[Gpu, bool, list[tuple[Profile, int]]]] | None, str]:
    """reconfigure-mig.sh step 1: the config from the mounted ConfigMap, planned per GPU.

    ([(gpu, mig enabled, placements)], "") or (None, why it fails)."""
    source = mig_config_source(cluster)
    if source is None:
        return None, "no mig-parted ConfigMap found"
    cm_name, text = source
    configs, error = _cached_parse(text, parse_mig_parted)
    if error is not None:
        return None, f"{cm_name}: {error}"
    entries = configs.get(config)
    if entries is None:
        return None, f"config {config!r} not found in ConfigMap {cm_name} (as mounted in the MIG manager)"
    wanted: list[tuple[Gpu, bool, list[tuple[Profile, int]]]] = []
    try:
        for gpu in node.gpus:
            entry = next((e for e in entries if _entry_matches(e, gpu)), None)
            if entry is None:
                continue
            if gpu.lost:
                raise ValueError(f"GPU {gpu.index} is lost")
            plan = plan_for_gpu(gpu.product, entry.get("mig-devices") or {}) if entry["mig-enabled"] else []
            wanted.append((gpu, entry["mig-enabled"], plan))
    except ValueError as exc:
        return None, f"config {config!r}: {exc}"
    if not wanted:
        return None, f"config {config!r} matches no GPU on node {node.name}"
    return wanted, f"{config!r} from {cm_name}"


def _gpu_matches(gpu: Gpu, enabled: bool, plan: list[tuple[Profile, int]]) -> bool:
    """mig-parted assert for one GPU: MIG mode and profile counts, every instance with its full CI."""
    if not enabled:
        return not gpu.mig_current and not gpu.mig_pending
    if not gpu.mig_current:
        return False
    partial = any(ci.slices != gi.profile.compute_slices for gi, ci in gpu.mig_devices())
    return (
        gpu.layout() == sorted(p.name for p, _ in plan)
        and not partial
        and all(gi.full_ci() for gi in gpu.instances.values())
    )


def _already_applied(wanted) -> bool:
    return all(_gpu_matches(gpu, enabled, plan) for gpu, enabled, plan in wanted)


def apply_mig_config(cluster: Cluster, node: Node, config: str) -> tuple[bool, str]:
    """What `nvidia-mig-parted apply -c <config>` would do to the node; (ok, message).

    All GPUs are validated before any is changed, so a failure leaves the node as it was.
    GPUs whose current layout already matches are left alone (mig-parted asserts first),
    which keeps their MIG UUIDs stable.
    """
    from . import scheduler

    busy = scheduler.gpu_pods_on_node(cluster, node.name)
    if busy:
        return False, f"refusing to reconfigure MIG while GPU pods run: {', '.join(busy[:5])}"
    wanted, source = resolve_mig_config(cluster, node, config)
    if wanted is None:
        return False, source
    try:
        for gpu, enabled, plan in wanted:
            if not enabled:
                for gi in list(gpu.instances.values()):
                    gi.compute_instances.clear()
                    gpu.destroy_gpu_instance(gi.id)
                gpu.mig_current = gpu.mig_pending = 0
                continue
            gpu.mig_current = gpu.mig_pending = 1
            if _gpu_matches(gpu, enabled, plan):
                continue
            gpu.apply_layout(plan)
    except HardwareError as exc:  # pragma: no cover - plans are validated above
        return False, f"config {config!r}: {exc}"
    return True, f"applied {source}"


# --- The driver upgrade controller (ClusterPolicy spec.driver.upgradePolicy) ---------------------------
# NVIDIA/k8s-operator-libs pkg/upgrade/consts.go: the per-node state label
# nvidia.com/<driver>-driver-upgrade-state ("gpu" for the GPU Operator's driver) and its states, walked by
# pkg/upgrade/upgrade_state.go ApplyState; maxParallelUpgrades bounds the nodes past upgrade-required at once
# (0 = no bound). Modelled here as the states' sequence with a duration each, on a clock the caller advances.

DRIVER_UPGRADE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_SEQUENCE = (
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "drain-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
)
UPGRADE_FAILED = "upgrade-failed"
# Seconds each state lasts in the simulator (the driver pod's restart and validation dominate in practice).
UPGRADE_DURATIONS = {
    "upgrade-required": 0,
    "cordon-required": 1,
    "wait-for-jobs-required": 1,
    "pod-deletion-required": 1,
    "drain-required": 5,
    "pod-restart-required": 120,
    "validation-required": 60,
    "uncordon-required": 1,
}


@dataclass
class DriverUpgradeController:
    """The upgrade controller of one simulated cluster: nodes labelled upgrade-required walk the states.

    `fail_validation`: nodes whose new driver fails validation (they end in upgrade-failed, cordoned);
    `never_return`: nodes that go NotReady in pod-restart-required and never come back."""

    max_parallel: int = 1
    fail_validation: set[str] = field(default_factory=set)
    never_return: set[str] = field(default_factory=set)
    since: dict[str, float] = field(default_factory=dict)

    def step(self, cluster: Cluster, now: float) -> dict[str, str]:
        """Advance every node whose state's duration has run out by `now`; returns {node: state}."""
        active = [n for n in cluster.nodes.values() if n.labels.get(DRIVER_UPGRADE_LABEL) in UPGRADE_SEQUENCE[1:-1]]
        slots = len(cluster.nodes) if self.max_parallel == 0 else self.max_parallel - len(active)
        for node in sorted(cluster.nodes.values(), key=lambda n: n.name):
            state = node.labels.get(DRIVER_UPGRADE_LABEL, "")
            if state not in UPGRADE_SEQUENCE[:-1]:
                continue
            started = self.since.setdefault(node.name, now)
            if now - started < UPGRADE_DURATIONS[state]:
                continue
            if state == "upgrade-required":
                if slots <= 0:
                    continue
                slots -= 1
            if state == "pod-restart-required" and node.name in self.never_return:
                node.ready = False
                cluster.touch(node)
                continue
            following = UPGRADE_SEQUENCE[UPGRADE_SEQUENCE.index(state) + 1]
            if state == "validation-required" and node.name in self.fail_validation:
                following = UPGRADE_FAILED
            if following == "cordon-required":
                node.unschedulable = True
            node.labels[DRIVER_UPGRADE_LABEL] = following
            self.since[node.name] = now
            cluster.touch(node)  # the API serves the change (resourceVersion, watch event)
        return {n.name: n.labels.get(DRIVER_UPGRADE_LABEL, "") for n in cluster.nodes.values()}
