"""Kubeconfig files that point the official client at a SimServer."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(
    path: str | Path, url: str, *, name: str = "simcluster", token: str = "simcluster", namespace: str = "default"
) -> Path:
    """Write a kubeconfig for `url` (plain http, bearer token) and return its path.

    Load it with `kubernetes.config.new_client_from_config(config_file=path)`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": f"{name}-user", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-user", "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
