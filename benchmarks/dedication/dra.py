"""`python manage.py bench dra`: exact binding with DRA under a churn of pods (docs/dra.md).

`measure_dra_wrong_device(nodes, projects, seed)` is the hook `bench dedication` calls: it builds the simulator's
"dra" scenario (half the nodes with 2 GPUs of 2 x 3g.40gb, half with 2 whole GPUs, NVIDIA's DRA driver
publishing their ResourceSlices), serves it over HTTP, registers and discovers it on the current database,
gives each project a MIG pool of 3 x 3g.40gb (pools straddle nodes, so projects share them) and every other
project a whole-GPU pool, provisions them (one
ResourceClaimTemplate per pool and kind, through the official client), then runs a seeded churn of pods:

- `own`: a pod referencing one of its project's templates;
- `foreign_template`: a pod referencing another project's template name (not in its namespace: it must wait);
- `forged`: a ResourceClaim, or a ResourceClaimTemplate, written by a project member in the project's namespace
  whose CEL selector names a device of another project, and a pod using it (when the write is admitted);
- deletions of running pods, so devices are freed and taken again.

After every step each pod's allocated devices are checked against what its claim admits, computed
independently from the database (template pods: the pool's unit UUIDs; forged claims: the device named):

- `dra_wrong_device`: pods given a device outside their claim (must be 0);
- `cross_project_via_template`: pods given another project's device through a gpuaas template (must be 0);
- `double_allocated`: devices held by two running pods at once (must be 0);
- `forged_refused`: forged writes kube-apiserver refused at admission (gpuaas's ValidatingAdmissionPolicy,
  deploy/admission-policy.yaml, on in the "dra" scenario as on a cluster installed by docs/deploying.md);
- `forged_obtained_foreign`: forged claims that obtained another project's device (must be 0 with the policy;
  `--without-admission-policy` shows what a cluster without it lets through: any free device);
- `attribution_errors`: after one discovery, running pods whose WorkloadProfile does not name the device
  their claim holds, or names another project (must be 0).

The caller provides the database (bench dra runs in a throwaway one, benchmarks.pools.bench_database).
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from unittest import mock

from django.contrib.auth import get_user_model
from django.test import override_settings

from capacity.models import Cluster, WorkloadProfile
from capacity.services.clusters import register_cluster
from capacity.services.discovery import discover_cluster
from pools import services
from pools.models import Allocation, GpuPool
from pools.provisioning import provision_pool
from simcluster import SimServer, load_scenario
from simcluster.kube import ApiError, ClusterApi
from simcluster.state import SimState
from tenancy.models import Project

from ..capacity import unique_name
from ..pools import bench_database
from ..registry import Smoke, arg, benchmark
from ..targets import correctness

UUID = 'device.attributes["gpu.nvidia.com"].uuid'
MEMBER = "alice"  # a project member: may create pods, claims and templates in the project's namespace (RBAC)


def _pod(name: str, claim_ref: dict) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", **claim_ref}],
        },
    }


def _device_uuids(cluster) -> dict[tuple[str, str], str]:
    """(pool, device name) -> UUID over every ResourceSlice."""
    return {
        (record.obj["spec"]["pool"]["name"], device["name"]): device["attributes"]["uuid"]["string"]
        for record in cluster.resourceslices.values()
        for device in record.obj["spec"]["devices"]
    }


def _allocated(cluster, namespace: str, pod: dict, uuids: dict[tuple[str, str], str]) -> list[str]:
    """UUIDs of the devices the pod's claims hold."""
    names = [s["resourceClaimName"] for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()]
    names += [c["resourceClaimName"] for c in pod["spec"]["resourceClaims"] if c.get("resourceClaimName")]
    found = []
    for name in names:
        claim = cluster.resourceclaims.get((namespace, name))
        results = (
            (((claim.obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
            if claim
            else ()
        )
        found.extend(uuids[(r["pool"], r["device"])] for r in results)
    return found


def _world(nodes: int, projects: int, seed: int, workdir: Path, admission_policy: bool):
    """Serve the scenario, register + discover it, create projects and pools, provision them."""
    state = load_scenario("dra", nodes=nodes).build(SimState(seed=seed), mig_manager_delay=3600)
    state.cluster("dra").settings.admission_policy = admission_policy
    server = SimServer(state).start()
    path = server.write_kubeconfigs(workdir)["dra"]
    name = unique_name("bench-dra-", seed)
    cluster, _ = register_cluster(name, path)
    with override_settings(NVML_LIBRARY="benchmarks.capacity.snapshot_nvml"):
        run = discover_cluster(cluster.pk, inventory="inline").run
    if run.status != "succeeded":
        raise RuntimeError(f"discovery failed: {run.error}")
    operator, _ = get_user_model().objects.get_or_create(username="bench-dra-operator")
    mig_units = 2 * 2 * (nodes // 2)  # MIG nodes: 2 GPUs x 2 x 3g.40gb
    # 3 units each (at most half the MIG units, so free targets remain): pools straddle nodes of 4 instances,
    # so projects share nodes, as in issue #15.
    per_project = max(1, min(3, mig_units // (2 * projects)))
    pools: dict[int, list[GpuPool]] = {}
    with mock.patch.object(services, "enqueue_provisioning"):
        for i in range(projects):
            slug = f"{name}-p{i}"
            project = Project.objects.create(name=slug, slug=slug, namespace=f"dra-p{seed}-{i}")
            wanted = [("3g.40gb", per_project)] + ([("", 1)] if i % 2 == 0 else [])
            for profile, count in wanted:
                spec = (
                    services.resolve_spec(product="H100-80GB", profile_name=profile)
                    if profile
                    else (services.resolve_spec(product="H100-80GB", isolation="full"))
                )
                request = services.create_request(
                    project,
                    actor=operator,
                    submit=True,
                    count=count,
                    cluster=cluster,
                    isolation=spec.isolation,
                    tier=spec.tier,
                    spec_kind=spec.spec_kind,
                    product=spec.product,
                    profile_name=spec.profile_name,
                )
                pools.setdefault(project.pk, []).append(services.approve(request, actor=operator))
    for project_pools in pools.values():
        for pool in project_pools:
            if provision_pool(pool) != "active":
                raise RuntimeError(f"provisioning of pool {pool.pk} failed: {pool.state_reason}")
    return state, server, cluster, pools


def measure_dra_wrong_device(
    nodes: int = 20, projects: int = 5, seed: int = 15, *, rounds: int = 6, admission_policy: bool = True
) -> dict:
    """Build a DRA fleet, provision pools for `projects` projects, run a seeded churn of pods; see the module doc."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        state, server, cluster, pools = _world(nodes, projects, seed, Path(workdir), admission_policy)
        try:
            return _churn(state, cluster, pools, seed, rounds, started)
        finally:
            server.stop()


def _churn(
    state, cluster_row: Cluster, pools: dict[int, list[GpuPool]], seed: int, rounds: int, started: float
) -> dict:
    rng = random.Random(seed)
    sim = state.cluster("dra")
    api = ClusterApi(sim, user=MEMBER)  # a project member's kubectl
    projects = {p.pk: p for p in Project.objects.filter(pk__in=list(pools))}
    owned: dict[str, int] = {}  # uuid -> project id
    templates: dict[int, list[tuple[str, set[str]]]] = {}  # project -> [(template name, admitted uuids)]
    for project_id, project_pools in pools.items():
        for pool in project_pools:
            rows = Allocation.objects.active().filter(pool=pool).values_list("mig_instance__uuid", "gpu__uuid")
            uuids = {mig or gpu for mig, gpu in rows}
            owned.update(dict.fromkeys(sorted(uuids), project_id))  # sorted: the churn is the same for a seed
            if pool.claim_template:
                templates.setdefault(project_id, []).append((pool.claim_template, uuids))
    admitted: dict[tuple[str, str], set[str]] = {}  # pod key -> what its claim admits
    kinds: dict[tuple[str, str], str] = {}
    counts = {"pods_created": 0, "own": 0, "foreign_template": 0, "forged": 0, "forged_refused": 0, "deleted": 0}
    # Distinct pods (devices, for double_allocated) seen breaking each rule at any check.
    checks: dict[str, set] = {
        name: set()
        for name in (
            "dra_wrong_device",
            "cross_project_via_template",
            "double_allocated",
            "forged_obtained_foreign",
            "foreign_template_scheduled",
        )
    }
    serial = 0
    churn_started = time.perf_counter()
    project_ids = sorted(pools)
    for _ in range(rounds):
        for project_id in project_ids:
            namespace = projects[project_id].namespace
            for _ in range(3):
                serial += 1
                name = f"pod-{serial}"
                roll = rng.random()
                key = (namespace, name)
                with state.lock:
                    if roll < 0.6:
                        template, uuids = rng.choice(templates[project_id])
                        api.create("pods", namespace, _pod(name, {"resourceClaimTemplateName": template}))
                        admitted[key], kinds[key] = uuids, "own"
                    elif roll < 0.8:
                        other = rng.choice([p for p in project_ids if p != project_id] or [project_id])
                        template, _ = rng.choice(templates[other])
                        api.create("pods", namespace, _pod(name, {"resourceClaimTemplateName": template}))
                        admitted[key], kinds[key] = set(), "foreign_template"
                    else:
                        target = rng.choice([u for u, p in owned.items() if p != project_id] or list(owned))
                        forged = f"forged-{serial}"
                        as_template = rng.random() < 0.5
                        spec = {
                            "devices": {
                                "requests": [
                                    {
                                        "name": "gpu",
                                        "exactly": {
                                            "deviceClassName": "mig.nvidia.com"
                                            if target.startswith("MIG-")
                                            else "gpu.nvidia.com",
                                            "selectors": [{"cel": {"expression": f"{UUID} == '{target}'"}}],
                                        },
                                    }
                                ]
                            }
                        }
                        counts["forged"] += 1
                        try:
                            if as_template:
                                api.create(
                                    "resourceclaimtemplates",
                                    namespace,
                                    {"metadata": {"name": forged}, "spec": {"spec": spec}},
                                )
                            else:
                                api.create("resourceclaims", namespace, {"metadata": {"name": forged}, "spec": spec})
                        except ApiError as exc:
                            if exc.code != 403 or "ValidatingAdmissionPolicy" not in exc.message:
                                raise RuntimeError(
                                    f"forged {'template' if as_template else 'claim'} refused for "
                                    f"another reason: {exc.message}"
                                ) from None
                            counts["forged_refused"] += 1
                            continue
                        api.create(
                            "pods",
                            namespace,
                            _pod(name, {"resourceClaimTemplateName" if as_template else "resourceClaimName": forged}),
                        )
                        admitted[key], kinds[key] = {target}, "forged"
                    counts["pods_created"] += 1
                    if kinds[key] != "forged":
                        counts[kinds[key]] += 1
            with state.lock:  # churn: some running pods of the project end
                running = [k for k, r in sim.pods.items() if k[0] == namespace and r.obj["spec"].get("nodeName")]
                for key in rng.sample(running, k=len(running) // 3):
                    api.delete("pods", key[0], key[1])
                    counts["deleted"] += 1
            with state.lock:
                _check(sim, admitted, kinds, owned, projects, checks)
    churn_s = time.perf_counter() - churn_started
    attribution = _attribution(sim, cluster_row, admitted, owned)
    with state.lock:
        running = sum(1 for k in admitted if k in sim.pods and sim.pods[k].obj["spec"].get("nodeName"))
        pending = sum(1 for k in admitted if k in sim.pods and not sim.pods[k].obj["spec"].get("nodeName"))
    return {
        "nodes": len(sim.nodes),
        "projects": len(pools),
        "pools": sum(len(p) for p in pools.values()),
        "units": len(owned),
        **counts,
        "running_at_end": running,
        "pending_at_end": pending,
        **{name: len(found) for name, found in checks.items()},
        "attribution_errors": attribution,
        "churn_s": round(churn_s, 3),
        "elapsed_s": round(time.perf_counter() - started, 3),
    }


def _check(sim, admitted, kinds, owned, projects, checks) -> None:
    """Every live pod against what its claim admits; devices held by two running pods."""
    project_of_namespace = {p.namespace: pk for pk, p in projects.items()}
    holders: dict[str, int] = {}
    uuids = _device_uuids(sim)
    for key, record in sim.pods.items():
        if key not in admitted:
            continue
        pod = record.obj
        if not pod["spec"].get("nodeName"):
            continue
        if kinds[key] == "foreign_template":
            checks["foreign_template_scheduled"].add(key)
        for uuid in _allocated(sim, key[0], pod, uuids):
            holders[uuid] = holders.get(uuid, 0) + 1
            if uuid not in admitted[key]:
                checks["dra_wrong_device"].add(key)
            owner = owned.get(uuid)
            if kinds[key] == "own" and owner != project_of_namespace[key[0]]:
                checks["cross_project_via_template"].add(key)
            if kinds[key] == "forged" and owner is not None and owner != project_of_namespace[key[0]]:
                checks["forged_obtained_foreign"].add(key)
    checks["double_allocated"].update(uuid for uuid, n in holders.items() if n > 1)


def _attribution(sim, cluster_row: Cluster, admitted, owned) -> int:
    """One discovery, then: each running pod's WorkloadProfile names its claim's device and its project."""
    if discover_cluster(cluster_row.pk, inventory="none").run.status != "succeeded":
        raise RuntimeError("discovery after the churn failed")
    rows = {}
    for pod_name, namespace, project_id, mig, gpu in WorkloadProfile.objects.filter(
        cluster=cluster_row, ended_at__isnull=True
    ).values_list("pod_name", "namespace", "project_id", "mig_instance__uuid", "gpu__uuid"):
        rows.setdefault((namespace, pod_name), []).append((project_id, mig or gpu))
    projects = dict(Project.objects.filter(namespace__in={k[0] for k in admitted}).values_list("namespace", "pk"))
    errors = 0
    with sim.state.lock:
        uuids = _device_uuids(sim)
        for key in admitted:
            record = sim.pods.get(key)
            if record is None or not record.obj["spec"].get("nodeName"):
                continue
            devices = sorted(_allocated(sim, key[0], record.obj, uuids))
            got = rows.get(key, [])
            if sorted(uuid for _, uuid in got) != devices or any(p != projects[key[0]] for p, _ in got):
                errors += 1
    return errors


@benchmark(
    "dra",
    help="Exact binding with DRA: pools on a simulated DRA fleet, a churn of own, foreign-template and forged "
    "claims; dra_wrong_device must be 0 (docs/dra.md).",
    arguments=[
        arg("--nodes", type=int, default=20),
        arg("--projects", type=int, default=5),
        arg("--seed", type=int, default=15),
        arg("--rounds", type=int, default=6),
        arg(
            "--without-admission-policy",
            action="store_true",
            help="a cluster without deploy/admission-policy.yaml: forged claims are admitted",
        ),
    ],
    targets=[
        correctness("dra_wrong_device", "==", 0),
        correctness("cross_project_via_template", "==", 0),
        correctness("double_allocated", "==", 0),
        correctness("foreign_template_scheduled", "==", 0),
        correctness("attribution_errors", "==", 0),
        # Without the admission policy forged claims are admitted on purpose: these hold only with it.
        correctness("forged_obtained_foreign", "==", 0, when=lambda r: r.get("admission_policy")),
        correctness("forged_refused", "==", "forged", when=lambda r: r.get("admission_policy")),
    ],
    smoke=Smoke(("--nodes", "4", "--projects", "2", "--rounds", "2")),
)
def run_dra_bench(
    *, nodes: int, projects: int, seed: int, rounds: int, without_admission_policy: bool = False, **_options
) -> dict:
    with bench_database():
        return {
            "benchmark": "dra",
            "admission_policy": not without_admission_policy,
            **measure_dra_wrong_device(
                nodes, projects, seed, rounds=rounds, admission_policy=not without_admission_policy
            ),
        }
