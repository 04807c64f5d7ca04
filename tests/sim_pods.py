"""One way for tests to start a GPU pod in the simulator (imported as `sim_pods` from any test folder)."""

from simcluster.kube import ClusterApi


def run_gpu_pod(
    state, cluster, namespace: str, name: str, *, node: str = "", resource: str = "nvidia.com/mig-3g.40gb", **spec
) -> dict:
    """Create `namespace` if missing and a pod in it asking for one `resource` (on `node` when given; more pod
    spec fields in `spec`), through the simulated API server; returns the simulator's pod object."""
    api = ClusterApi(cluster)
    body = {
        "containers": [{"name": "main", "image": "x", "resources": {"limits": {resource: "1"}}}],
        **spec,
    }
    if node:
        body["nodeSelector"] = {"kubernetes.io/hostname": node}
    with state.lock:
        if namespace not in cluster.namespaces:
            api.create("namespaces", None, {"metadata": {"name": namespace}})
        api.create("pods", namespace, {"metadata": {"name": name, "namespace": namespace}, "spec": body})
        return cluster.pods[(namespace, name)].obj
