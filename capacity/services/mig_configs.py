"""The GPU Operator documents gpuaas writes: its mig-parted ConfigMap and the device plugin's sharing config.

mig-parted (reference/nvidia.md §2): ConfigMap `gpuaas-mig-parted-config`, key `config.yaml`, in the
operator namespace. The MIG manager reads exactly one file, so ours carries the operator's named
configs (all-disabled, all-enabled, all-<profile>, all-balanced, one entry per product filter) as
well as gpuaas's own: every MigLayout as `gpuaas-<name>` and every reconfiguration's config that is
open or still named by a node's nvidia.com/mig.config label. The document is rebuilt from the
database each time, so writing it is idempotent.

Device plugin (§4): ConfigMap `time-slicing-config`, one key per time-slicing policy, each a v1
config with sharing.timeSlicing.resources [{name: nvidia.com/gpu, replicas: N}]; nodes pick their key
with the label nvidia.com/device-plugin.config. Keys that are not gpuaas's are left alone.
"""

from __future__ import annotations

import logging
from collections import Counter

import yaml
from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.choices import SharingStrategy
from capacity.mig.catalog import Product, get_product, mig_parted_entries, named_configs
from capacity.models import (
    GPUAAS_CONFIG_PREFIX,
    Cluster,
    MigLayout,
    MigReconfiguration,
    MigReconfigurationQuerySet,
    NodeCapacity,
    TimeSlicingPolicy,
)

logger = logging.getLogger(__name__)

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_PARTED_KEY = "config.yaml"
WRITE_ATTEMPTS = 5  # optimistic-concurrency retries on a ConfigMap someone else changed meanwhile


def operator_namespace() -> str:
    return getattr(settings, "GPU_OPERATOR_NAMESPACE", "gpu-operator")


def mig_parted_configmap() -> str:
    return getattr(settings, "MIG_PARTED_CONFIGMAP", "gpuaas-mig-parted-config")


def time_slicing_configmap() -> str:
    return getattr(settings, "TIME_SLICING_CONFIGMAP", "time-slicing-config")


def client_for(cluster) -> kube.KubernetesClient:
    """The cluster's Kubernetes client (a context manager)."""
    return kube.KubernetesClient.for_cluster(cluster)


# --- mig-parted ------------------------------------------------------------------------------


def named_config_entries() -> dict[str, list[dict]]:
    """The GPU Operator's shipped configs for every catalog product, in mig-parted v1 form.

    Products sharing a config name with identical mig-devices share one entry whose device-filter
    lists their PCI ids, as NVIDIA's own default-mig-parted-config does.
    """
    return mig_parted_entries()


def is_named_config(name: str) -> bool:
    return name in named_config_entries()


def named_config_targets(name: str, product: Product | str, gpu_indices) -> dict[int, list[str] | None]:
    """Per-GPU targets of a named config on a node of `product` (KeyError if it has no such config)."""
    product = product if isinstance(product, Product) else get_product(product)
    configs = named_configs(product)
    if name not in configs:
        raise KeyError(f"{product.key} has no named config {name!r}; known: {', '.join(configs)}")
    devices = configs[name]
    profiles = None if devices is None else [p for p, n in devices.items() for _ in range(n)]
    return {int(i): (None if profiles is None else list(profiles)) for i in gpu_indices}


def _profile_names(value) -> list[str] | None:
    """A target value ([names] or [{"profile", "start"}]) as profile names; None = MIG off."""
    if value is None:
        return None
    return [v["profile"] if isinstance(v, dict) else v for v in value]


def entries_for_targets(product: Product | str, targets: dict) -> list[dict]:
    """mig-parted entries for per-GPU targets {index: profiles | None}: one entry per identical layout.

    `devices` is "all" when `targets` is {"all": ...}, else the list of GPU indices sharing the layout;
    device-filter is the product's PCI id so the entry never matches another GPU model.
    """
    product = product if isinstance(product, Product) else get_product(product)
    groups: dict[tuple | None, list] = {}
    for key, value in targets.items():
        names = _profile_names(value)
        shape = None if names is None else tuple(sorted(Counter(names).items()))
        groups.setdefault(shape, []).append(key)
    entries = []
    for shape, keys in sorted(groups.items(), key=lambda item: min(str(k).zfill(4) for k in item[1])):
        devices = "all" if keys == ["all"] else sorted(int(k) for k in keys)
        entry: dict = {"device-filter": [product.pci_id_hex], "devices": devices, "mig-enabled": shape is not None}
        if shape is not None:
            entry["mig-devices"] = dict(shape)
        entries.append(entry)
    return entries


def mig_parted_document(cluster) -> dict:
    """The whole gpuaas mig-parted document for `cluster`, rebuilt from the database."""
    configs = named_config_entries()
    for layout in MigLayout.objects.order_by("name"):
        configs[layout.config_name] = entries_for_targets(layout.product, layout.gpus)
    labelled = list(
        NodeCapacity.objects.present()
        .filter(cluster=cluster, mig_config__startswith=GPUAAS_CONFIG_PREFIX)
        .values_list("mig_config", flat=True)
    )
    latest_success = (
        MigReconfiguration.objects.filter(cluster=cluster, state="succeeded")
        .values("node_id")
        .annotate(last=Max("id"))
        .values("last")
    )
    reconfigurations = (
        MigReconfiguration.objects.filter(cluster=cluster, config_name__startswith=GPUAAS_CONFIG_PREFIX)
        .exclude(config_name__in=list(configs))
        .filter(
            Q(state__in=MigReconfigurationQuerySet.OPEN_STATES) | Q(config_name__in=labelled) | Q(pk__in=latest_success)
        )
        .order_by("id")
    )
    for reconf in reconfigurations:
        product = reconf.plan.get("product") if isinstance(reconf.plan, dict) else None
        if product:
            configs[reconf.config_name] = entries_for_targets(product, reconf.target)
    return {"version": "v1", "mig-configs": configs}


def dump_yaml(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def write_mig_parted_config(cluster, client: kube.KubernetesClient | None = None) -> dict:
    """Create or replace gpuaas's mig-parted ConfigMap from the database. Idempotent.

    Optimistic concurrency: the replace carries the resourceVersion read just before, and on a
    conflict the document is rebuilt from the database and written again. Callers commit their own
    config name before writing, so two reconfigurations writing at once both end up in the file.
    Returns the document written; Kubernetes errors propagate (KubernetesError).
    """
    if client is None:
        with client_for(cluster) as own:
            return _write_mig_parted(cluster, own)
    return _write_mig_parted(cluster, client)


def adopted_configs(client: kube.KubernetesClient) -> dict[str, list]:
    """Configs of the site's own mig-parted ConfigMaps (MIG_PARTED_ADOPT_CONFIGMAPS, by default the
    operator's default-mig-parted-config) that gpuaas does not define itself.

    The MIG manager reads one file: once it reads ours, a node still labelled with a site config
    (e.g. one an administrator added to the default file) must find it there too. Unreadable or
    missing ConfigMaps are skipped.
    """
    adopted: dict[str, list] = {}
    names = getattr(settings, "MIG_PARTED_ADOPT_CONFIGMAPS", ["default-mig-parted-config"])
    for name in names:
        try:
            text = (client.get_config_map(operator_namespace(), name).get("data") or {}).get(MIG_PARTED_KEY, "")
            document = yaml.safe_load(text) if text else None
        except (kube.NotFound, yaml.YAMLError):
            continue
        configs = document.get("mig-configs") if isinstance(document, dict) else None
        if isinstance(configs, dict):
            for config, entries in configs.items():
                if isinstance(entries, list):
                    adopted.setdefault(str(config), entries)
    return adopted


def _write_mig_parted(cluster, client: kube.KubernetesClient) -> dict:
    namespace, name = operator_namespace(), mig_parted_configmap()
    labels = {"app.kubernetes.io/managed-by": "gpuaas", "app": "nvidia-mig-manager"}
    adopted = adopted_configs(client)
    for _ in range(WRITE_ATTEMPTS):
        try:
            version = (client.get_config_map(namespace, name).get("metadata") or {}).get("resourceVersion", "")
        except kube.NotFound:
            version = None
        document = mig_parted_document(cluster)
        for config, entries in adopted.items():
            document["mig-configs"].setdefault(config, entries)
        data = {MIG_PARTED_KEY: dump_yaml(document)}
        try:
            if version is None:
                client.create_config_map(namespace, name, data, labels=labels)
            else:
                client.replace_config_map(namespace, name, data, labels=labels, resource_version=version)
            return document
        except kube.Conflict:
            continue
    raise kube.Conflict(f"ConfigMap {namespace}/{name} kept changing; gave up after {WRITE_ATTEMPTS} attempts")


# --- time-slicing ----------------------------------------------------------------------------


def time_slicing_document(policy) -> dict:
    """The device plugin v1 config for one policy: sharing.timeSlicing, or sharing.mps for an MPS policy.

    MPS takes renameByDefault and resources[].replicas only (NVIDIA/k8s-device-plugin README "With CUDA MPS",
    api/config/v1/sharing.go and replicas.go): the plugin's MPS control daemon caps each client at
    memory / replicas and 100 / replicas % of the SMs, and always fails requests for more than one replica.
    An operator's tighter client limits are not a plugin setting: they reach pods through the pool's
    ConfigMap (TimeSlicingPolicy.client_environment, pools/provisioning/).
    """
    resources = [{"name": "nvidia.com/gpu", "replicas": int(policy.replicas)}]
    if policy.strategy == SharingStrategy.MPS:
        return {
            "version": "v1",
            "sharing": {"mps": {"renameByDefault": bool(policy.rename_by_default), "resources": resources}},
        }
    return {
        "version": "v1",
        "sharing": {
            "timeSlicing": {
                "renameByDefault": bool(policy.rename_by_default),
                "failRequestsGreaterThanOne": bool(policy.fail_requests_greater_than_one),
                "resources": resources,
            }
        },
    }


def merge_config_map_keys(
    client: kube.KubernetesClient, namespace: str, name: str, ours: dict[str, str], prefix: str
) -> None:
    """Replace the keys starting with `prefix` by `ours`, keep every other key; optimistic retries."""
    for _ in range(WRITE_ATTEMPTS):
        try:
            current = client.get_config_map(namespace, name)
        except kube.NotFound:
            try:
                client.create_config_map(namespace, name, ours, labels={"app.kubernetes.io/managed-by": "gpuaas"})
                return
            except kube.Conflict:
                continue
        data = {k: v for k, v in (current.get("data") or {}).items() if not k.startswith(prefix)}
        data.update(ours)
        meta = current.get("metadata") or {}
        try:
            client.replace_config_map(
                namespace, name, data, labels=meta.get("labels"), resource_version=meta.get("resourceVersion", "")
            )
            return
        except kube.Conflict:
            continue
    raise kube.Conflict(f"ConfigMap {namespace}/{name} kept changing; gave up after {WRITE_ATTEMPTS} attempts")


def apply_time_slicing(cluster, *, client: kube.KubernetesClient | None = None) -> dict:
    """Write every enabled time-slicing policy of `cluster` and label its nodes. Idempotent.

    The ConfigMap gets one gpuaas-* key per enabled policy (other keys are kept); each present node
    of a policy's group (the most specific policy wins: a group's own over the cluster-wide one) is
    labelled nvidia.com/device-plugin.config=<key>; nodes whose label names a gpuaas key they no
    longer have lose the label. Returns {"keys": [...], "labelled": n, "unlabelled": n}.
    """
    policies = list(TimeSlicingPolicy.objects.filter(cluster=cluster, enabled=True).order_by("node_group"))
    ours = {p.config_key: dump_yaml(time_slicing_document(p)) for p in policies}
    by_group = {p.node_group: p for p in policies}
    nodes = list(NodeCapacity.objects.present().filter(cluster=cluster).order_by("name"))

    def run(k: kube.KubernetesClient) -> dict:
        merge_config_map_keys(k, operator_namespace(), time_slicing_configmap(), ours, GPUAAS_CONFIG_PREFIX)
        labelled = unlabelled = 0
        for node in nodes:
            policy = by_group.get(node.node_group) or by_group.get("")
            current = (node.labels or {}).get(DEVICE_PLUGIN_CONFIG_LABEL)
            if policy is not None:
                k.patch_node_labels(node.name, {DEVICE_PLUGIN_CONFIG_LABEL: policy.config_key})
                labelled += 1
            elif current and current.startswith(GPUAAS_CONFIG_PREFIX):
                k.patch_node_labels(node.name, {DEVICE_PLUGIN_CONFIG_LABEL: None})
                unlabelled += 1
        return {"keys": sorted(ours), "labelled": labelled, "unlabelled": unlabelled}

    try:
        if client is None:
            with client_for(cluster) as own:
                result = run(own)
        else:
            result = run(client)
    except kube.KubernetesError as exc:
        TimeSlicingPolicy.objects.filter(pk__in=[p.pk for p in policies]).update(
            last_error=f"{type(exc).__name__}: {exc}"
        )
        raise
    now = timezone.now()
    with transaction.atomic():
        for policy in policies:
            count = sum(1 for n in nodes if (by_group.get(n.node_group) or by_group.get("")) is policy)
            TimeSlicingPolicy.objects.filter(pk=policy.pk).update(applied_at=now, nodes_labelled=count, last_error="")
    return result


# --- Publishing (after commit) ----------------------------------------------------------------


def publish() -> None:
    """Rewrite gpuaas's mig-parted ConfigMap on every cluster after commit (a layout changed)."""
    from capacity.tasks import write_mig_parted_config_task  # cycle: capacity.tasks imports this module

    ids = list(Cluster.objects.order_by("pk").values_list("pk", flat=True))
    transaction.on_commit(lambda: [write_mig_parted_config_task.delay(pk) for pk in ids])


def enqueue_time_slicing(cluster_id: int) -> None:
    """Queue apply_time_slicing for one cluster after commit."""
    from capacity.tasks import apply_time_slicing_task  # cycle: capacity.tasks imports this module

    transaction.on_commit(lambda: apply_time_slicing_task.delay(cluster_id))
