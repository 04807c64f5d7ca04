"""`KubernetesClient`: one cluster's API, the transport plus the calls gpuaas makes, grouped by kind of object."""

from __future__ import annotations

from .clusterpolicy import ClusterPolicyCalls
from .configuration import configuration_for, load_configuration
from .dra import DraCalls
from .kubevirt import KubevirtCalls
from .namespaces import NamespaceCalls
from .nodes import NodeCalls
from .pods import PodCalls
from .scheduling import SchedulingCalls


class KubernetesClient(
    NodeCalls, PodCalls, NamespaceCalls, DraCalls, SchedulingCalls, KubevirtCalls, ClusterPolicyCalls
):
    """One cluster's API: reads return parsed dataclasses, writes return the object as a dict.

    Use as a context manager (or call close()) so the connection pool is released.
    """

    @classmethod
    def from_kubeconfig(cls, path: str, context: str = "", **kwargs) -> KubernetesClient:
        return cls(load_configuration(kubeconfig_path=path, context=context), **kwargs)

    @classmethod
    def for_cluster(cls, cluster, **kwargs) -> KubernetesClient:
        """The client for a capacity.Cluster row: in-cluster, stored kubeconfig, or kubeconfig path."""
        return cls(configuration_for(cluster), **kwargs)
