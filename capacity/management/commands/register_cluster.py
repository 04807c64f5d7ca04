"""`python manage.py register_cluster NAME --kubeconfig PATH [--context C]`: add or update a cluster."""

from django.core.management.base import BaseCommand, CommandError

from capacity.adapters.kubernetes import ConfigError
from capacity.services.clusters import register_cluster


class Command(BaseCommand):
    help = "Register a Kubernetes cluster (or point an existing one at a new kubeconfig)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Cluster name (a slug), used in queue names node.<cluster>.<node>.")
        parser.add_argument("--kubeconfig", required=True, help="Path to a kubeconfig readable by the workers.")
        parser.add_argument("--context", default="", help="Context in the kubeconfig (default: its current-context).")

    def handle(self, *args, name, kubeconfig, context, **options):
        try:
            cluster, created = register_cluster(name, kubeconfig, context=context)
        except (ConfigError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        verb = "registered" if created else "updated"
        self.stdout.write(f"{cluster.name}: {verb} ({cluster.api_endpoint}, kubeconfig {cluster.kubeconfig_path})")
