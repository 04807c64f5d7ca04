"""simcluster: simulated on-prem Kubernetes GPU clusters for gpuaas development and tests.

It stands where the real world would be: behind the Kubernetes HTTP API (a fake
kube-apiserver the official client talks to unchanged) and behind the pynvml module
interface (a fake NVML per node). The Django apps never import it; settings point them
at it. See README.md in this package.
"""

from .apiserver import SimServer
from .kubeconfig import write_kubeconfig
from .nvml import library_for_node, library_for_state
from .runner import main
from .scenarios import Scenario, ScenarioError, load_scenario
from .state import ClusterSettings, SimState

__all__ = [
    "ClusterSettings",
    "Scenario",
    "ScenarioError",
    "SimServer",
    "SimState",
    "library_for_node",
    "library_for_state",
    "load_scenario",
    "main",
    "write_kubeconfig",
]
