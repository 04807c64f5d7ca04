"""Registering clusters: a Cluster row pointing at a kubeconfig that has been checked to load."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction

from capacity.adapters import kubernetes as kube
from capacity.models import Cluster


def register_cluster(name: str, kubeconfig_path: str | Path, *, context: str = "") -> tuple[Cluster, bool]:
    """Create or update the cluster NAME to use the kubeconfig at PATH (and CONTEXT); (cluster, created).

    The file must exist and load (kube.ConfigError otherwise, naming the problem); the path is stored
    absolute, the API server URL as the informational api_endpoint. Idempotent; touches one row.
    """
    try:
        validate_slug(name)
    except ValidationError:
        raise ValueError(f"cluster name {name!r} must be a slug (letters, digits, '-' and '_')") from None
    path = Path(kubeconfig_path).expanduser().resolve()
    if not path.is_file():
        raise kube.ConfigError(f"kubeconfig {path} does not exist")
    contexts, current = kube.kubeconfig_contexts(str(path))
    if context and context not in contexts:
        raise kube.ConfigError(f"kubeconfig {path} has no context {context!r}; it has: {', '.join(contexts)}")
    if not context and not current:
        raise kube.ConfigError(f"kubeconfig {path} has no current-context; pass one of: {', '.join(contexts)}")
    configuration = kube.load_configuration(kubeconfig_path=str(path), context=context)
    with transaction.atomic():
        cluster, created = Cluster.objects.select_for_update().get_or_create(
            name=name,
            defaults={"kubeconfig_path": str(path), "kubeconfig_context": context, "api_endpoint": configuration.host},
        )
        if not created:
            cluster.kubeconfig_path = str(path)
            cluster.kubeconfig_context = context
            cluster.api_endpoint = configuration.host[:500]
            cluster.in_cluster = False
            cluster.encrypted_kubeconfig = ""  # the file given now is what discovery must use
            cluster.save(
                update_fields=[
                    "kubeconfig_path",
                    "kubeconfig_context",
                    "api_endpoint",
                    "in_cluster",
                    "encrypted_kubeconfig",
                ]
            )
    return cluster, created
