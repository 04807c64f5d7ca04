"""Registering clusters: a Cluster row pointing at a kubeconfig that has been checked to load."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction

from capacity import credentials
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


class UndecryptableCredentials(Exception):
    """Stored kubeconfigs that no key of CREDENTIALS_KEYS decrypts; `names` lists their clusters."""

    def __init__(self, names: list[str]):
        self.names = names
        super().__init__(
            f"the stored kubeconfig of {', '.join(names)} cannot be decrypted with any of CREDENTIALS_KEYS:"
            " add the key it was encrypted with (after the first) and run again; nothing was changed"
        )


def rotate_credentials() -> tuple[int, int]:
    """Re-encrypt every stored kubeconfig under the first of CREDENTIALS_KEYS; (re-encrypted, already current).

    All or nothing: the rows are locked in primary-key order for one transaction, and if any of them
    cannot be decrypted with any key, UndecryptableCredentials is raised before anything is written.
    Idempotent: a kubeconfig the first key already decrypts is left as it is, so a second run writes nothing.
    """
    with transaction.atomic():
        clusters = list(
            Cluster.objects.select_for_update()
            .exclude(encrypted_kubeconfig="")
            .order_by("pk")
            .only("pk", "name", "encrypted_kubeconfig")
        )
        stale = [c for c in clusters if not credentials.is_current(c.encrypted_kubeconfig)]
        rotated, undecryptable = [], []
        for cluster in stale:
            try:
                cluster.encrypted_kubeconfig = credentials.rotate(cluster.encrypted_kubeconfig)
            except ValueError:
                undecryptable.append(cluster.name)
            else:
                rotated.append(cluster)
        if undecryptable:
            raise UndecryptableCredentials(undecryptable)
        Cluster.objects.bulk_update(rotated, ["encrypted_kubeconfig"])
    return len(rotated), len(clusters) - len(rotated)
