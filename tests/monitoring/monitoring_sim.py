"""An in-process simulated cluster mirrored into the database by discovery (monitoring tests).

One node `h100-01`: GPU 0 MIG (3g.40gb, 2g.20gb, 1g.10gb; Hopper, GPM supported), GPU 1 full.
One node `a100-01`: GPU 0 MIG (2 x 3g.40gb; Ampere: no GPM, so no SM activity).
Not a test module (no test_ prefix).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from capacity.adapters import nvml
from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity
from capacity.services.discovery import discover_cluster
from simcluster import SimServer
from simcluster.scenarios import Scenario

_names = itertools.count(1)


@dataclass
class Sim:
    state: object
    server: SimServer
    cluster: Cluster
    name: str

    def node(self, name: str) -> NodeCapacity:
        return NodeCapacity.objects.get(cluster=self.cluster, name=name)

    def gpu(self, node: str, index: int) -> GpuCapacity:
        return GpuCapacity.objects.get(node__cluster=self.cluster, node__name=node, index=index)

    def instance(self, node: str, profile: str) -> MigInstance:
        return MigInstance.objects.active().get(
            gpu__node__name=node, gpu__node__cluster=self.cluster, profile__name=profile
        )

    @property
    def faults(self):
        return self.state.faults


def start(tmp_path) -> Sim:
    name = f"mon{next(_names)}"  # gpuoperator caches ConfigMaps per cluster name across states
    scenario = Scenario.from_dict(
        {
            "name": "monitoring",
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
                            "mig_layout": {"0": ["3g.40gb", "2g.20gb", "1g.10gb"]},
                        },
                        {
                            "name_prefix": "a100",
                            "count": 1,
                            "product": "A100-80GB",
                            "gpus_per_node": 1,
                            "mig_strategy": "mixed",
                            "mig_layout": ["3g.40gb", "3g.40gb"],
                        },
                    ],
                }
            ],
        }
    )
    state = scenario.build(mig_manager_delay=3600)
    server = SimServer(state).start()
    path = server.write_kubeconfigs(tmp_path)[name]
    cluster = Cluster.objects.create(name=name, kubeconfig_path=str(path))
    outcome = discover_cluster(cluster.pk, inventory="inline")
    assert outcome.run.status == "succeeded", outcome.run.error
    nvml.forget_xid_watchers()
    return Sim(state, server, cluster, name)
