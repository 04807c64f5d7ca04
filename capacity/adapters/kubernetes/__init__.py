"""The Kubernetes adapter: the only package of the apps that imports the `kubernetes` library.

One `KubernetesClient` per cluster, each with its own `ApiClient` and `Configuration` (the
client's global default configuration is never read or written), built from a kubeconfig file,
an (already decrypted) kubeconfig text, or the pod's in-cluster service account.

Every call:
- has a timeout (settings.KUBERNETES_TIMEOUT_S, connect and read);
- is retried up to settings.KUBERNETES_RETRIES times on 429 (honouring Retry-After), 5xx,
  timeouts and connection errors, with exponential backoff and jitter;
- reads the response with `_preload_content=False` and parses the JSON itself into small
  dataclasses or plain dicts (the client's model deserialisation costs more than the HTTP);
- raises only `KubernetesError` and its subclasses, never kubernetes.* or urllib3 exceptions.

Lists are paged (limit/continue, settings.KUBERNETES_PAGE_SIZE). A failure on any page fails the
whole list: a partial list is never returned as if complete. An expired continue token (410)
restarts the list from the beginning once.

Split by job:
- configuration: a Configuration per cluster (kubeconfig file or text, in-cluster), its API URL;
- transport: the ApiClient, timeouts, retries with backoff (`backoff_sleep`), paging;
- errors: KubernetesError and its subclasses by HTTP status;
- objects: the parsed Node and Pod (GPU Operator labels, extended-resource requests);
- nodes, pods, namespaces: the calls on each kind of object (namespaces also holds resource quotas
  and ConfigMaps), and dra (resource.k8s.io/v1: ResourceSlices, ResourceClaims, gpuaas's
  ResourceClaimTemplates), combined into `KubernetesClient` in client;
- apply: server-side apply of any kind as field manager `gpuaas` (with dry-run), the kind's URL from discovery;
- kubevirt: the KubeVirt CR's permitted mediated devices (vGPU types VMs may use).
"""

from .apply import APPLY_PATCH, FIELD_MANAGER
from .client import KubernetesClient
from .configuration import api_url_for, configuration_for, kubeconfig_contexts, load_configuration
from .errors import (
    ConfigError,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    KubernetesError,
    NotFound,
    TooManyRequests,
    Unavailable,
)
from .objects import (
    NODE_SELECTOR_ANNOTATION,
    DraDevice,
    Node,
    Pod,
    ResourceClaim,
    parse_node,
    parse_pod,
    parse_resource_claim,
    parse_resource_slice,
    pod_extended_requests,
)
from .transport import (
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    MERGE_PATCH,
    ONBOARDING_USER_AGENT,
    RETRY_AFTER_MAX_S,
    backoff_sleep,
)

__all__ = [
    "APPLY_PATCH",
    "FIELD_MANAGER",
    "BACKOFF_BASE_S",
    "BACKOFF_CAP_S",
    "MERGE_PATCH",
    "NODE_SELECTOR_ANNOTATION",
    "ONBOARDING_USER_AGENT",
    "RETRY_AFTER_MAX_S",
    "ConfigError",
    "Conflict",
    "DraDevice",
    "Expired",
    "Forbidden",
    "Invalid",
    "KubernetesClient",
    "KubernetesError",
    "Node",
    "NotFound",
    "Pod",
    "ResourceClaim",
    "TooManyRequests",
    "Unavailable",
    "api_url_for",
    "backoff_sleep",
    "configuration_for",
    "kubeconfig_contexts",
    "load_configuration",
    "parse_node",
    "parse_pod",
    "parse_resource_claim",
    "parse_resource_slice",
    "pod_extended_requests",
]
