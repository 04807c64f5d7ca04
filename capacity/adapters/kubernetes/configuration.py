"""One `Configuration` per cluster, from a kubeconfig file, a stored kubeconfig text or the in-cluster account.

The client's process-wide default configuration is never read or written.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from .errors import ConfigError


def _fresh_configuration() -> k8s.Configuration:
    # Configuration() copies the process-wide default; type.__call__ builds a pristine one.
    return type.__call__(k8s.Configuration)


def load_configuration(
    *,
    kubeconfig_path: str = "",
    kubeconfig_text: str | None = None,
    context: str = "",
    in_cluster: bool = False,
) -> k8s.Configuration:
    """A Configuration of its own for one cluster; raises ConfigError naming what is wrong."""
    cfg = _fresh_configuration()
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)
        elif kubeconfig_text:
            data = yaml.safe_load(kubeconfig_text)
            if not isinstance(data, dict):
                raise ConfigError("the stored kubeconfig is not a YAML mapping")
            k8s_config.load_kube_config_from_dict(
                data, context=context or None, client_configuration=cfg, persist_config=False
            )
        elif kubeconfig_path:
            path = Path(kubeconfig_path).expanduser()
            if not path.is_file():
                raise ConfigError(f"kubeconfig {path} does not exist")
            k8s_config.load_kube_config(
                config_file=str(path), context=context or None, client_configuration=cfg, persist_config=False
            )
        else:
            raise ConfigError("no kubeconfig path, kubeconfig text or in-cluster configuration given")
    except ConfigError:
        raise
    except (ConfigException, yaml.YAMLError, OSError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"cannot load kubeconfig: {exc}") from None
    # Retries are ours (below), so urllib3 must not retry underneath.
    cfg.retries = False
    return cfg


def configuration_for(cluster) -> k8s.Configuration:
    """The Configuration of a capacity.Cluster row: in-cluster, stored kubeconfig, or kubeconfig path."""
    try:
        text = None if cluster.in_cluster else cluster.kubeconfig_text()
    except ValueError as exc:  # undecryptable stored credentials
        raise ConfigError(str(exc)) from None
    return load_configuration(
        kubeconfig_path=cluster.kubeconfig_path,
        kubeconfig_text=text,
        context=cluster.kubeconfig_context,
        in_cluster=cluster.in_cluster,
    )


def api_url_for(cluster) -> str:
    """The cluster's API server URL from its credentials, else the informational api_endpoint."""
    try:
        return configuration_for(cluster).host
    except ConfigError:
        return cluster.api_endpoint


def kubeconfig_contexts(path: str) -> tuple[list[str], str]:
    """(context names, current context) of a kubeconfig file; ConfigError if unreadable."""
    try:
        contexts, current = k8s_config.list_kube_config_contexts(config_file=str(Path(path).expanduser()))
    except (ConfigException, yaml.YAMLError, OSError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from None
    return [c["name"] for c in contexts], (current or {}).get("name", "")
