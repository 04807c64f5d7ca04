"""Scenarios: declarative clusters (YAML) built into a SimState, with their expected counts.

A scenario file (simcluster/scenarios/<name>.yaml, or any path):

    name: demo
    seed: 42
    params: {nodes: 2000}            # defaults for ${param} placeholders; override with load_scenario(..., nodes=10)
    clusters:
      - name: prod
        driver_version: "550.54.15"  # optional ClusterSettings fields
        dra: true                    # the NVIDIA DRA driver instead of the device plugin (simcluster/dra.py)
        admission_policy: true       # gpuaas's ValidatingAdmissionPolicy installed (simcluster/admission.py)
        node_groups:
          - name_prefix: prod-h100-bal
            count: 2                 # or share: 0.3 (of params.nodes; the last share group takes the rest)
            product: H100-80GB       # capacity.mig.catalog key (or NVML / GFD name)
            gpus_per_node: 8
            mig_strategy: mixed      # none | single | mixed
            mig_layout: all-balanced # a named mig-parted config, a list of profiles (["4g.40gb", "3g"]),
                                     # or per GPU index {"0-3": all-balanced, "4-7": ["7g"]}; "3g" = the
                                     # product's 3-slice profile; null/absent = MIG off (all-disabled)
            mig_config: prod-4g-3g   # config name for non-named layouts (added to default-mig-parted-config)
            time_slicing: 4          # or {replicas: 4, resources: [nvidia.com/gpu], rename_by_default: false}
            tier: "1"                # label gpuaas.io/tier: 1 | 2 | 3 | full
            labels: {topology.kubernetes.io/zone: zone-a}
            taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
        namespaces:
          - {name: team-a, labels: {}, annotations: {}, quota: {requests.nvidia.com/gpu: "8"}}
        pods:
          - {namespace: team-a, name: train, count: 2, requests: {nvidia.com/gpu: 4},
             node_selector: {gpuaas.io/tier: full}, node_name: optional, labels: {}}

`Scenario.expected_counts()` derives the numbers a discovery run must find from the spec
alone (not from the built state), so tests comparing the two are meaningful:

    {"clusters": {"prod": {"nodes": 6,
                           "gpus": {"H100-80GB": 48},            # physical GPUs per product key
                           "mig_enabled_gpus": {"H100-80GB": 32},
                           "full_gpus": {"H100-80GB": 16},       # MIG disabled
                           "mig_instances": {"H100-80GB": {"1g.10gb": 32, ...}},
                           "tiers": {"1": 2, "2": 2, "full": 2}, # nodes per gpuaas.io/tier
                           "allocatable": {"nvidia.com/gpu": 16, "nvidia.com/mig-1g.10gb": 32, ...},
                           "pods": 5}},
     "totals": {same keys summed over clusters}}
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from capacity.mig.catalog import Product, Profile, get_product, named_configs

from . import gpuoperator, kubevirt_cr
from .kube import ApiError, ClusterApi, node_json
from .state import ClusterSettings, SimState

SCENARIO_DIR = Path(__file__).parent / "scenarios"
TIER_LABEL = "gpuaas.io/tier"
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
_SHAPE = re.compile(r"^(\d)g$")


class ScenarioError(ValueError):
    """The scenario file asks for something the simulator cannot build."""


@dataclass
class TimeSlicing:
    replicas: int
    resources: list[str]
    rename_by_default: bool = False

    @property
    def key(self) -> str:
        suffix = "-renamed" if self.rename_by_default else ""
        names = (
            ""
            if self.resources == ["nvidia.com/gpu"]
            else "-" + "-".join(r.removeprefix("nvidia.com/").replace(".", "-") for r in self.resources)
        )
        return f"time-sliced-{self.replicas}{names}{suffix}"

    def document(self) -> dict:
        return {
            "version": "v1",
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": self.rename_by_default,
                    "resources": [{"name": r, "replicas": self.replicas} for r in self.resources],
                }
            },
        }


@dataclass
class NodeGroup:
    name_prefix: str
    count: int
    product: Product
    gpus_per_node: int
    mig_strategy: str
    layouts: list[dict[str, int] | None]  # per GPU index: mig-devices (None = MIG off)
    mig_config: str  # the nvidia.com/mig.config label value
    custom_config: list[dict] | None  # mig-parted entries when the config is not a shipped one
    time_slicing: TimeSlicing | None
    tier: str | None
    labels: dict[str, str]
    taints: list[dict]

    def node_names(self) -> list[str]:
        width = max(2, len(str(self.count)))
        return [f"{self.name_prefix}-{i:0{width}d}" for i in range(1, self.count + 1)]


@dataclass
class ClusterSpec:
    name: str
    settings: ClusterSettings
    groups: list[NodeGroup]
    namespaces: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)


def _substitute(value, params: dict):
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value.strip())
        if whole:
            if whole.group(1) not in params:
                raise ScenarioError(f"unknown parameter ${{{whole.group(1)}}}")
            return params[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: str(params[m.group(1)]), value)
    if isinstance(value, list):
        return [_substitute(v, params) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, params) for k, v in value.items()}
    return value


def _resolve_profile(product: Product, name: str) -> Profile:
    if m := _SHAPE.match(str(name)):
        slices = int(m.group(1))
        for p in product.profiles:
            if p.compute_slices == slices and not p.has_media_extensions and (slices != 1 or p.memory_slices == 1):
                return p
        raise ScenarioError(f"{product.key} has no {name} profile")
    try:
        return product.profile(str(name))
    except KeyError as exc:
        raise ScenarioError(str(exc).strip('"')) from None


def _layout_devices(product: Product, layout) -> dict[str, int] | None:
    """One GPU's layout -> mig-devices counts (None = MIG off)."""
    if layout is None or layout == "all-disabled":
        return None
    if isinstance(layout, str):
        configs = named_configs(product)
        if layout not in configs:
            raise ScenarioError(f"{product.key} has no named MIG config {layout!r}; known: {', '.join(configs)}")
        return dict(configs[layout] or {}) if configs[layout] is not None else None
    if isinstance(layout, list):
        counts = Counter(_resolve_profile(product, name).name for name in layout)
        return dict(counts)
    raise ScenarioError(f"bad mig_layout {layout!r}")


def _indices(spec: str, gpus: int) -> list[int]:
    result = []
    for part in str(spec).split(","):
        start, _, end = part.strip().partition("-")
        result.extend(range(int(start), int(end or start) + 1))
    if any(i >= gpus for i in result):
        raise ScenarioError(f"GPU index range {spec!r} beyond {gpus} GPUs")
    return result


def _parse_group(raw: dict, count: int) -> NodeGroup:
    try:
        product = get_product(str(raw["product"]))
    except KeyError as exc:
        raise ScenarioError(str(exc).strip('"')) from None
    gpus = int(raw.get("gpus_per_node", 8))
    strategy = raw.get("mig_strategy", "none")
    if strategy not in ("none", "single", "mixed"):
        raise ScenarioError(f"mig_strategy must be none, single or mixed, got {strategy!r}")
    layout = raw.get("mig_layout")
    if isinstance(layout, dict):
        layouts: list = [None] * gpus
        for spec, value in layout.items():
            for i in _indices(spec, gpus):
                layouts[i] = _layout_devices(product, value)
        named = None
    else:
        per_gpu = _layout_devices(product, layout)
        layouts = [per_gpu] * gpus
        named = layout if isinstance(layout, str) else ("all-disabled" if layout is None else None)
    for devices in layouts:
        if devices:
            try:
                gpuoperator.plan_for_gpu(product, devices)
            except ValueError as exc:
                raise ScenarioError(str(exc)) from None
    custom = None
    if named is None:
        config = raw.get("mig_config") or f"{raw['name_prefix']}-layout"
        groups: dict[tuple, list[int]] = {}
        for i, devices in enumerate(layouts):
            groups.setdefault(tuple(sorted((devices or {}).items())) if devices is not None else None, []).append(i)
        custom = [
            {"devices": indices, "mig-enabled": key is not None, **({"mig-devices": dict(key)} if key else {})}
            for key, indices in groups.items()
        ]
    else:
        config = named
    ts_raw = raw.get("time_slicing")
    time_slicing = None
    if ts_raw:
        if isinstance(ts_raw, int):
            ts_raw = {"replicas": ts_raw}
        time_slicing = TimeSlicing(
            replicas=int(ts_raw["replicas"]),
            resources=[r if "/" in r else f"nvidia.com/{r}" for r in ts_raw.get("resources", ["nvidia.com/gpu"])],
            rename_by_default=bool(ts_raw.get("rename_by_default", False)),
        )
    return NodeGroup(
        name_prefix=str(raw["name_prefix"]),
        count=count,
        product=product,
        gpus_per_node=gpus,
        mig_strategy=strategy,
        layouts=layouts,
        mig_config=config,
        custom_config=custom,
        time_slicing=time_slicing,
        tier=str(raw["tier"]) if raw.get("tier") is not None else None,
        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
        taints=list(raw.get("taints") or []),
    )


@dataclass
class Scenario:
    name: str
    seed: int
    clusters: list[ClusterSpec]
    params: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, document: dict, **params) -> Scenario:
        document = copy.deepcopy(document)
        merged = {**(document.pop("params", None) or {}), **params}
        document = _substitute(document, merged)
        clusters = []
        for raw_cluster in document.get("clusters") or []:
            settings = ClusterSettings()
            for key in (
                "driver_version",
                "cuda_version",
                "kubernetes_version",
                "operator_namespace",
                "mig_config_name",
                "device_plugin_config_name",
                "device_plugin_default",
                "machine",
            ):
                if raw_cluster.get(key) is not None:
                    setattr(settings, key, str(raw_cluster[key]))
            if raw_cluster.get("dra") is not None:
                settings.dra = bool(raw_cluster["dra"])
            if raw_cluster.get("admission_policy") is not None:
                settings.admission_policy = bool(raw_cluster["admission_policy"])
            raw_groups = raw_cluster.get("node_groups") or []
            total = int(merged.get("nodes", 0))
            shared = [g for g in raw_groups if "share" in g]
            assigned = 0
            groups = []
            for raw in raw_groups:
                if "share" in raw:
                    if raw is shared[-1]:
                        count = max(0, total - assigned)
                    else:
                        count = int(round(float(raw["share"]) * total))
                    assigned += count
                else:
                    count = int(raw.get("count", 1))
                groups.append(_parse_group(raw, count))
            clusters.append(
                ClusterSpec(
                    name=str(raw_cluster["name"]),
                    settings=settings,
                    groups=groups,
                    namespaces=list(raw_cluster.get("namespaces") or []),
                    pods=list(raw_cluster.get("pods") or []),
                )
            )
        if not clusters:
            raise ScenarioError("a scenario needs at least one cluster")
        return cls(
            name=str(document.get("name", "scenario")),
            seed=int(document.get("seed", 0)),
            clusters=clusters,
            params=merged,
        )

    # --- building ---------------------------------------------------------------------

    def build(self, state: SimState | None = None, *, mig_manager_delay: float = 0.2) -> SimState:
        """Create every cluster, node, namespace, quota and pod; returns the state."""
        state = state or SimState(seed=self.seed, mig_manager_delay=mig_manager_delay)
        with state.lock:
            for spec in self.clusters:
                self._build_cluster(state, spec)
            state.tick(0.0)  # first metric values
            state.scenario_name = self.name
            for cluster in state.clusters.values():  # warm the node JSON cache: the first list is fast too
                for node in cluster.nodes.values():
                    node_json(cluster, node)
        return state

    def _build_cluster(self, state: SimState, spec: ClusterSpec) -> None:
        cluster = state.add_cluster(spec.name, copy.deepcopy(spec.settings))
        api = ClusterApi(cluster)
        kubevirt_cr.install(api)
        ns = cluster.settings.operator_namespace
        custom = {g.mig_config: g.custom_config for g in spec.groups if g.custom_config}
        if custom:
            gpuoperator.add_mig_configs(cluster, custom)
        sharing = {g.time_slicing.key: g.time_slicing for g in spec.groups if g.time_slicing}
        if sharing:
            api.create(
                "configmaps",
                ns,
                {
                    "metadata": {"name": cluster.settings.device_plugin_config_name},
                    "data": {
                        key: yaml.safe_dump(ts.document(), sort_keys=False) for key, ts in sorted(sharing.items())
                    },
                },
            )
        for group in spec.groups:
            for name in group.node_names():
                node = cluster.add_node(
                    name, group.product, group.gpus_per_node, mig_strategy=group.mig_strategy, labels=group.labels
                )
                node.labels.update(gpuoperator.operator_labels(node))
                if group.tier is not None:
                    node.labels[TIER_LABEL] = group.tier
                node.taints = [dict(t) for t in group.taints]
                node.labels[gpuoperator.MIG_CONFIG_LABEL] = group.mig_config
                if group.time_slicing:
                    node.labels[gpuoperator.DEVICE_PLUGIN_CONFIG_LABEL] = group.time_slicing.key
                gpuoperator.resolve_sharing(cluster, node)
                ok, message = gpuoperator.apply_mig_config(cluster, node, group.mig_config)
                if not ok:
                    raise ScenarioError(f"node {name}: {message}")
                node.mig_message = message
                node.labels[gpuoperator.MIG_STATE_LABEL] = "success"
                gpuoperator.refresh_node(cluster, node)
        try:
            for raw in spec.namespaces:
                api.create(
                    "namespaces",
                    None,
                    {
                        "metadata": {
                            "name": raw["name"],
                            "labels": raw.get("labels") or {},
                            "annotations": raw.get("annotations") or {},
                        }
                    },
                )
                if raw.get("quota"):
                    api.create(
                        "resourcequotas",
                        raw["name"],
                        {
                            "metadata": {"name": raw.get("quota_name", "gpu-quota")},
                            "spec": {"hard": {k: str(v) for k, v in raw["quota"].items()}},
                        },
                    )
            for raw in spec.pods:
                for pod in _pod_bodies(raw):
                    api.create("pods", raw["namespace"], pod)
        except ApiError as exc:
            raise ScenarioError(f"cluster {spec.name}: {exc.message}") from None

    # --- expectations -----------------------------------------------------------------

    def expected_counts(self) -> dict:
        clusters = {spec.name: _expected_cluster(spec) for spec in self.clusters}
        totals: dict = {}
        for counts in clusters.values():
            _accumulate(totals, counts)
        return {"clusters": clusters, "totals": totals}


def _accumulate(into: dict, counts: dict) -> None:
    for key, value in counts.items():
        if isinstance(value, dict):
            _accumulate(into.setdefault(key, {}), value)
        else:
            into[key] = into.get(key, 0) + value


def _expected_cluster(spec: ClusterSpec) -> dict:
    counts: dict = {
        "nodes": 0,
        "gpus": {},
        "mig_enabled_gpus": {},
        "full_gpus": {},
        "mig_instances": {},
        "tiers": {},
        "allocatable": {},
        "pods": sum(int(p.get("count", 1)) for p in spec.pods),
    }

    def add(section: dict, key: str, n: int) -> None:
        if n:
            section[key] = section.get(key, 0) + n

    for group in spec.groups:
        n, key = group.count, group.product.key
        counts["nodes"] += n
        if group.tier is not None:
            add(counts["tiers"], group.tier, n)
        add(counts["gpus"], key, n * group.gpus_per_node)
        per_node_resources: Counter = Counter()
        mig_gpus = sum(1 for layout in group.layouts if layout is not None)
        add(counts["mig_enabled_gpus"], key, n * mig_gpus)
        add(counts["full_gpus"], key, n * (group.gpus_per_node - mig_gpus))
        instances: Counter = Counter()
        for layout in group.layouts:
            for profile_name, c in (layout or {}).items():
                instances[profile_name] += c
        for profile_name, c in instances.items():
            add(counts["mig_instances"].setdefault(key, {}), profile_name, n * c)
        if group.mig_strategy == "none" or mig_gpus == 0:
            per_node_resources["nvidia.com/gpu"] += group.gpus_per_node
        elif group.mig_strategy == "mixed":
            per_node_resources["nvidia.com/gpu"] += group.gpus_per_node - mig_gpus
            for profile_name, c in instances.items():
                per_node_resources[group.product.profile(profile_name).resource_name] += c
        else:  # single: valid only with every GPU MIG-enabled, non-empty, one profile
            names = set(instances)
            if mig_gpus == group.gpus_per_node and all(group.layouts) and len(names) == 1:
                per_node_resources["nvidia.com/gpu"] += sum(instances.values())
            else:
                per_node_resources["nvidia.com/gpu"] += 0
        ts = group.time_slicing
        for resource, c in per_node_resources.items():
            if ts and resource in ts.resources and ts.replicas > 1:
                name = f"{resource}.shared" if ts.rename_by_default else resource
                add(counts["allocatable"], name, n * c * ts.replicas)
            else:
                add(counts["allocatable"], resource, n * c)
    return counts


def _pod_bodies(raw: dict) -> list[dict]:
    count = int(raw.get("count", 1))
    names = [raw["name"]] if count == 1 else [f"{raw['name']}-{i}" for i in range(count)]
    limits = {k: str(v) for k, v in (raw.get("requests") or {}).items()}
    bodies = []
    for name in names:
        spec: dict = {
            "containers": [
                {
                    "name": "main",
                    "image": raw.get("image", "nvcr.io/nvidia/pytorch:24.05-py3"),
                    "resources": {"limits": limits, "requests": limits},
                }
            ]
        }
        if raw.get("node_selector"):
            spec["nodeSelector"] = dict(raw["node_selector"])
        if raw.get("node_name"):
            spec["nodeName"] = raw["node_name"]
        if raw.get("tolerations"):
            spec["tolerations"] = list(raw["tolerations"])
        bodies.append(
            {"metadata": {"name": name, "labels": dict(raw.get("labels") or {"app": raw["name"]})}, "spec": spec}
        )
    return bodies


def load_scenario(name_or_path: str | Path, **params) -> Scenario:
    """A built-in scenario by name ("demo", "scale") or a YAML file path; params override
    the file's `params` (e.g. load_scenario("scale", nodes=100, gpus_per_node=4))."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
        raise ScenarioError(f"no scenario {name_or_path!r}; built-in: {known}")
    document = yaml.safe_load(path.read_text())
    return Scenario.from_dict(document, **params)


def available_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
