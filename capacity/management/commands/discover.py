"""`python manage.py discover [--cluster NAME] [--no-inventory]`: discover now, in this process."""

from django.core.management.base import BaseCommand, CommandError

from capacity.choices import DiscoveryStatus
from capacity.models import Cluster, SpecAndCount
from capacity.services import discovery


class Command(BaseCommand):
    help = (
        "Discover clusters synchronously and print a summary. Node inventory runs in this process under a "
        "per-node NVML factory (the simulator); with the real local pynvml it is queued to the node agents."
    )

    def add_arguments(self, parser):
        parser.add_argument("--cluster", help="Only this cluster (default: every registered cluster).")
        parser.add_argument("--no-inventory", action="store_true", help="Kubernetes view only; no NVML inventory.")

    def handle(self, *args, cluster=None, no_inventory=False, **options):
        clusters = Cluster.objects.order_by("name")
        if cluster:
            clusters = clusters.filter(name=cluster)
            if not clusters:
                known = ", ".join(Cluster.objects.order_by("name").values_list("name", flat=True)) or "none"
                raise CommandError(f"unknown cluster {cluster!r}; known clusters: {known}")
        elif not clusters:
            raise CommandError("no clusters registered: use `manage.py register_cluster NAME --kubeconfig PATH`")
        mode = discovery.INVENTORY_NONE if no_inventory else discovery.inventory_mode_default()
        failed = []
        for row in clusters:
            outcome = discovery.discover_cluster(row.pk, inventory=mode)
            self.stdout.write(self._summary(row, outcome, mode))
            if outcome.run.status != DiscoveryStatus.SUCCEEDED:
                failed.append(row.name)
        if failed:
            raise CommandError(f"discovery failed for {len(failed)} of {len(clusters)} clusters: {', '.join(failed)}")

    def _summary(self, cluster, outcome, mode) -> str:
        run = outcome.run
        if run.status != DiscoveryStatus.SUCCEEDED:
            return self.style.ERROR(f"{cluster.name}: failed: {run.error}")
        sync = outcome.sync
        lines = [
            self.style.SUCCESS(f"{cluster.name}: ")
            + f"{run.nodes_seen} GPU nodes ({sync.nodes_created} new, {sync.nodes_updated} changed, "
            f"{run.nodes_gone} gone, {sync.not_ready} not ready), {run.gpus_seen} GPUs; workloads "
            f"{sync.workloads.created} new, {sync.workloads.ended} ended"
        ]
        if outcome.inventory is not None:
            inv = outcome.inventory
            lines.append(
                f"  inventory: {inv.nodes} nodes, {inv.gpus} GPUs ({inv.gpus_lost} lost), "
                f"{inv.mig_instances} MIG instances ({inv.mig_gone} gone)"
                + (f", {len(inv.errors)} nodes failed: {', '.join(sorted(inv.errors))}" if inv.errors else "")
            )
        elif mode == discovery.INVENTORY_ENQUEUE:
            lines.append(f"  inventory: queued for {len(sync.inventory_nodes)} new or changed nodes")
        for spec in SpecAndCount.objects.filter(node__cluster=cluster).totals():
            label = spec["product"] + (f" {spec['profile_name']}" if spec["profile_name"] else f" {spec['kind']}")
            lines.append(f"  {label} x {spec['count']} ({spec['allocatable']} allocatable, {spec['resource_name']})")
        return "\n".join(lines)
