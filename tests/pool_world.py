"""The pools world, shared by the pools and scheduling tests (tests/conftest.py registers it with
`pytest_plugins`): a small fleet built from ORM rows as discovery would record them, API clients per persona,
the request maker, the demo simulator registered and discovered, and a helper to run jobs at once."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from capacity.choices import GpuHealth, MigStrategy, Tier
from capacity.mig.catalog import get_product
from capacity.mig.layout import validate_layout
from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity, SpecAndCount


class Fleet:
    """Builds clusters, nodes, GPUs and MIG instances as discovery would record them."""

    def __init__(self):
        self.clusters: dict[str, Cluster] = {}
        self._uuid = 0

    def cluster(self, name: str = "c1") -> Cluster:
        if name not in self.clusters:
            self.clusters[name] = Cluster.objects.create(name=name, kubeconfig_path=f"/tmp/{name}.kubeconfig")
        return self.clusters[name]

    def node(
        self,
        name: str,
        *,
        cluster: str = "c1",
        tier: str = Tier.NONE,
        product: str = "H100-80GB",
        replicas: int = 1,
        mig: bool = False,
        **fields,
    ) -> NodeCapacity:
        catalog = get_product(product)
        return NodeCapacity.objects.create(
            cluster=self.cluster(cluster),
            name=name,
            gpu_product=catalog.gfd_product,
            tier=tier,
            mig_strategy=MigStrategy.MIXED if mig else MigStrategy.NONE,
            timeslice_replicas=replicas,
            ready=True,
            **fields,
        )

    def gpu(
        self,
        node: NodeCapacity,
        index: int = 0,
        *,
        product: str = "H100-80GB",
        mig: bool = False,
        health: str = GpuHealth.OK,
    ) -> GpuCapacity:
        catalog = get_product(product)
        self._uuid += 1
        return GpuCapacity.objects.create(
            node=node,
            index=index,
            uuid=f"GPU-{self._uuid:04d}",
            product=catalog.model_name,
            catalog_product=catalog.key,
            memory_mib=catalog.memory_mib,
            mig_mode_current=mig,
            health=health,
        )

    def mig_gpu(self, node: NodeCapacity, index: int, layout: list[str], **kwargs) -> GpuCapacity:
        """A MIG GPU with `layout` placed as the catalog's validate_layout places it."""
        gpu = self.gpu(node, index, mig=True, **kwargs)
        placements = validate_layout(gpu.catalog_product, layout).placements
        for placement in placements:
            profile = MigProfile.objects.get(product=gpu.catalog_product, name=placement.profile)
            self._uuid += 1
            MigInstance.objects.create(
                gpu=gpu,
                profile=profile,
                placement=profile.valid_placements.get(start=placement.start),
                placement_start=placement.start,
                placement_size=placement.size,
                uuid=f"MIG-{self._uuid:04d}",
            )
            SpecAndCount.objects.update_or_create(
                node=node,
                resource_name=profile.resource_name,
                defaults={
                    "kind": "mig",
                    "product": gpu.catalog_product,
                    "profile": profile,
                    "profile_name": profile.name,
                },
            )
        return gpu

    def full_node(
        self, name: str, gpus: int = 2, *, cluster: str = "c1", tier: str = Tier.TRAINING, product: str = "H100-80GB"
    ) -> NodeCapacity:
        node = self.node(name, cluster=cluster, tier=tier, product=product)
        for index in range(gpus):
            self.gpu(node, index, product=product)
        SpecAndCount.objects.create(
            node=node, kind="full", product=product, resource_name="nvidia.com/gpu", count=gpus, allocatable=gpus
        )
        return node

    def timeslice_node(
        self,
        name: str,
        gpus: int = 1,
        replicas: int = 4,
        *,
        cluster: str = "c1",
        tier: str = Tier.DEVELOPMENT,
        product: str = "H100-80GB",
    ) -> NodeCapacity:
        node = self.node(name, cluster=cluster, tier=tier, replicas=replicas, product=product)
        for index in range(gpus):
            self.gpu(node, index, product=product)
        return node

    def mig_node(
        self,
        name: str,
        layouts: list[list[str]],
        *,
        cluster: str = "c1",
        tier: str = Tier.SLA_INFERENCE,
        product: str = "H100-80GB",
    ) -> NodeCapacity:
        node = self.node(name, cluster=cluster, tier=tier, product=product, mig=True)
        for index, layout in enumerate(layouts):
            self.mig_gpu(node, index, layout, product=product)
        return node


@pytest.fixture
def fleet(db) -> Fleet:
    return Fleet()


@pytest.fixture
def api():
    """api(user) -> an APIClient authenticated as `user` (None: anonymous)."""

    def make(user=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make


@pytest.fixture
def make_request(project, bob):
    """make_request(**fields) -> a PoolRequest created through the service (default: submitted 2 x 3g.40gb)."""
    from pools import services

    def make(*, state: str = "submitted", target=None, actor=None, **fields):
        values = {"product": "H100-80GB", "profile_name": "3g.40gb", "count": 2}
        values.update(fields)
        spec = services.resolve_spec(
            **{k: values.pop(k) for k in ("isolation", "tier", "product", "profile_name", "memory_gib") if k in values}
        )
        values.update(
            isolation=spec.isolation,
            tier=spec.tier,
            spec_kind=spec.spec_kind,
            product=spec.product,
            profile_name=spec.profile_name,
        )
        return services.create_request(target or project, actor=actor or bob, submit=state == "submitted", **values)

    return make


@pytest.fixture
def sim(db, tmp_path, settings):
    """The demo scenario served by an in-process SimServer, registered and discovered (inventory inline).

    Kubernetes retries are off so that an armed fault fails a call at once.
    """
    from capacity.services.clusters import register_cluster
    from capacity.services.discovery import discover_cluster
    from simcluster import SimServer, load_scenario

    settings.KUBERNETES_RETRIES = 0
    state = load_scenario("demo").build()
    with SimServer(state) as server:
        clusters = {}
        for name, path in server.write_kubeconfigs(tmp_path).items():
            cluster, _ = register_cluster(name, path)
            run = discover_cluster(cluster.pk, inventory="inline").run
            assert run.status == "succeeded", run.error
            clusters[name] = cluster
        server.clusters = clusters
        yield server


def kube_for(cluster):
    from capacity.adapters.kubernetes import KubernetesClient

    return KubernetesClient.for_cluster(cluster)


def run_concurrently(jobs):
    """Run the callables at once, each in its own thread (and database connection); their outcomes."""
    barrier = threading.Barrier(len(jobs))
    outcomes = [None] * len(jobs)

    def run(i, job):
        try:
            barrier.wait()
            outcomes[i] = job()
        except Exception as exc:  # the outcome under test
            outcomes[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
