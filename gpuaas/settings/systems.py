"""Outside systems (NVML, the kubelet's PodResources, node agents, Kubernetes, cluster credentials), logging
and API token lifetime."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from .base import DEBUG, GPUAAS_ROLE, SECRET_KEY
from .env import (
    ConfigurationError,
    derived_credentials_key,
    env_fernet_keys,
    env_int,
    env_str,
)

# --- Outside systems ------------------------------------------------------------------------
# Factory returning a pynvml-compatible library for (api_url, node_name). Production (DEBUG off):
# pynvml itself. With DEBUG=1 (demo, tests): the simulator's fake NVML (see simcluster/README.md).
NVML_LIBRARY = env_str(
    "NVML_LIBRARY", "simcluster.nvml.library_for_node" if DEBUG else "capacity.adapters.nvml.local_pynvml"
)
# The kubelet's PodResources socket the node agent asks which pod holds which device (docs/discovery.md
# "Which pod holds which device"). Production: the node's own socket, mounted read-only into the agent.
# With DEBUG=1 (demo, tests) the simulator serves one per node at this template ({api}: a digest of the
# cluster's API URL, {node}: the node name); a short path under the temporary directory, as a unix
# socket's path must stay under 108 bytes.
PODRESOURCES_SOCKET = env_str(
    "PODRESOURCES_SOCKET",
    str(Path(tempfile.gettempdir()) / "gpuaas-podres" / "{api}" / "{node}.sock")
    if DEBUG
    else "/var/lib/kubelet/pod-resources/kubelet.sock",
)
PODRESOURCES_TIMEOUT_S = env_int("PODRESOURCES_TIMEOUT_S", 10, minimum=1)
# Node agents (capacity/agent/, docs/security.md "Node agents"). The control plane derives every node's
# key from AGENT_SIGNING_SECRET (default: derived from SECRET_KEY); a node agent holds only its own node's
# key (AGENT_NODE_KEY, hex, from `manage.py agent-key CLUSTER NODE`) and signs for
# AGENT_CLUSTER_NAME/AGENT_NODE_NAME only. A simulated agent serving many nodes gets the secret instead.
AGENT_SIGNING_SECRET = (
    env_str("AGENT_SIGNING_SECRET", "") or hashlib.sha256(("gpuaas-agent-signing:" + SECRET_KEY).encode()).hexdigest()
)
AGENT_NODE_KEY = env_str("AGENT_NODE_KEY", "")
AGENT_CLUSTER_NAME = env_str("AGENT_CLUSTER_NAME", "")
AGENT_NODE_NAME = env_str("AGENT_NODE_NAME", "")
if AGENT_NODE_KEY:
    if not (AGENT_CLUSTER_NAME and AGENT_NODE_NAME):
        raise ConfigurationError("AGENT_NODE_KEY needs AGENT_CLUSTER_NAME and AGENT_NODE_NAME (the node it signs for)")
    try:
        if len(bytes.fromhex(AGENT_NODE_KEY)) != 32:
            raise ValueError
    except ValueError:
        raise ConfigurationError("AGENT_NODE_KEY must be 64 hex digits (`manage.py agent-key CLUSTER NODE`)") from None
if GPUAAS_ROLE == "node-agent" and not DEBUG and not (AGENT_NODE_KEY or env_str("AGENT_SIGNING_SECRET", "")):
    raise ConfigurationError("a node agent needs AGENT_NODE_KEY (its node's key: `manage.py agent-key CLUSTER NODE`)")
# The ingest worker (`manage.py ingest-worker`): reports per transaction, how long a partial batch
# waits for more, and when a killed ingest worker's unacknowledged batch is delivered again (Redis).
AGENT_INGEST_BATCH = env_int("AGENT_INGEST_BATCH", 500, minimum=1)
AGENT_INGEST_LINGER_MS = env_int("AGENT_INGEST_LINGER_MS", 1000, minimum=0)
AGENT_INGEST_VISIBILITY_S = env_int("AGENT_INGEST_VISIBILITY_S", 60, minimum=5)
KUBERNETES_TIMEOUT_S = env_int("KUBERNETES_TIMEOUT_S", 10, minimum=1)
KUBERNETES_RETRIES = env_int("KUBERNETES_RETRIES", 4, minimum=0)
KUBERNETES_PAGE_SIZE = env_int("KUBERNETES_PAGE_SIZE", 500, minimum=1)
# Fernet keys for stored cluster credentials: the first encrypts, all decrypt (rotation: put the new
# key first, run `manage.py rotate-credentials`, then drop the old one). CREDENTIALS_KEY is the
# one-key form. Required when DEBUG is off; with DEBUG=1 a key derived from SECRET_KEY is the default.
CREDENTIALS_KEYS = env_fernet_keys("CREDENTIALS_KEYS", "CREDENTIALS_KEY")
if not CREDENTIALS_KEYS:
    if not DEBUG and GPUAAS_ROLE != "node-agent":  # agents never read cluster credentials
        raise ConfigurationError(
            "CREDENTIALS_KEYS is required when DEBUG is off (Fernet keys, comma-separated, the first encrypts);"
            ' generate one with: python -c "from cryptography.fernet import Fernet;'
            ' print(Fernet.generate_key().decode())" (upgrading? see docs/security.md)'
        )
    CREDENTIALS_KEYS = [derived_credentials_key(SECRET_KEY)]

# --- Logging --------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"kubernetes": {"level": "WARNING"}, "urllib3": {"level": "WARNING"}},
}

# Personal API tokens live at most this many days (every token: API, admin, issue_token); 0: no limit.
# A token created by a request that authenticated with a token never outlives that token.
API_TOKEN_MAX_LIFETIME_DAYS = env_int("API_TOKEN_MAX_LIFETIME_DAYS", 365, minimum=0)
