"""A simulated node shared by two projects, mirrored into the database (trespass tests). Not a test module.

Node `h100-01`: GPU 0 MIG (3g.40gb at 0 and at 4), GPU 1 with MIG off. Project acme (team-acme) holds
the 3g.40gb at 0, project vision (team-vision) the one at 4; GPU 1 is unallocated.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sim_pods import run_gpu_pod

from capacity.models import Cluster, GpuCapacity, MigInstance
from capacity.services.discovery import discover_cluster
from pools.models import Allocation, GpuPool, PoolRequest
from simcluster import SimServer
from simcluster.kube import ClusterApi
from simcluster.scenarios import Scenario
from tenancy.models import Project

_names = itertools.count(1)


@dataclass
class Sim:
    state: object
    server: SimServer
    cluster: Cluster
    name: str
    acme: Project
    vision: Project

    @property
    def sim_cluster(self):
        return self.state.cluster(self.name)

    def discover(self) -> None:
        outcome = discover_cluster(self.cluster.pk, inventory="inline")
        assert outcome.run.status == "succeeded", outcome.run.error

    def instance(self, start: int) -> MigInstance:
        return MigInstance.objects.active().get(gpu__node__cluster=self.cluster, gpu__index=0, placement_start=start)

    def gpu(self, index: int) -> GpuCapacity:
        return GpuCapacity.objects.get(node__cluster=self.cluster, index=index)

    def run_pod(self, namespace: str, name: str, resource: str = "nvidia.com/mig-3g.40gb") -> dict:
        """Create a pod asking for one `resource` on h100-01; returns the simulator's pod object."""
        return run_gpu_pod(self.state, self.sim_cluster, namespace, name, node="h100-01", resource=resource)

    def pod(self, namespace: str, name: str) -> dict:
        with self.state.lock:
            record = self.sim_cluster.pods.get((namespace, name))
            return None if record is None else record.obj

    def delete_pod(self, namespace: str, name: str) -> None:
        api = ClusterApi(self.sim_cluster)
        with self.state.lock:
            api.delete("pods", namespace, name, 0)


def hold(project: Project, instance: MigInstance) -> Allocation:
    request = PoolRequest.objects.create(
        project=project, product=instance.gpu.catalog_product, state="active", count=1, profile_name="3g.40gb"
    )
    pool = GpuPool.objects.create(
        project=project,
        request=request,
        cluster=instance.gpu.node.cluster,
        name=f"pool-{request.pk}",
        workload_type="inference",
        state="active",
        provisioned_at=request.start_at,
    )
    return Allocation.objects.create(
        pool=pool,
        project=project,
        kind="mig",
        gpu=instance.gpu,
        mig_instance=instance,
        resource_name=instance.profile.resource_name,
        product=instance.gpu.catalog_product,
        profile_name=instance.profile.name,
        compute_slices=instance.profile.compute_slices,
        allocated_at=request.start_at,
    )


def start(tmp_path) -> Sim:
    name = f"tres{next(_names)}"
    scenario = Scenario.from_dict(
        {
            "name": "trespass",
            "seed": 5,
            "clusters": [
                {
                    "name": name,
                    "node_groups": [
                        {
                            "name_prefix": "h100",
                            "count": 1,
                            "product": "H100-80GB",
                            "gpus_per_node": 2,
                            "mig_strategy": "mixed",
                            "mig_layout": {"0": ["3g.40gb", "3g.40gb"]},
                        }
                    ],
                }
            ],
        }
    )
    state = scenario.build(mig_manager_delay=3600)
    server = SimServer(state).start()
    path = server.write_kubeconfigs(tmp_path)[name]
    cluster = Cluster.objects.create(name=name, kubeconfig_path=str(path))
    acme = Project.objects.create(slug="acme", name="Acme", namespace="team-acme")
    vision = Project.objects.create(slug="vision", name="Vision", namespace="team-vision")
    sim = Sim(state, server, cluster, name, acme, vision)
    sim.discover()
    hold(acme, sim.instance(0))
    hold(vision, sim.instance(4))
    return sim
