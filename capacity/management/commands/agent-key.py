"""`python manage.py agent-key CLUSTER NODE`: print a node agent's signing key (hex), for its AGENT_NODE_KEY.

The key is derived from AGENT_SIGNING_SECRET, which only the control plane holds; give each node
agent its own node's key and nothing more (docs/security.md "Node agents").
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from capacity.agent.protocol import node_key
from capacity.models import Cluster


class Command(BaseCommand):
    help = "Print the signing key (AGENT_NODE_KEY) of one node's agent."

    def add_arguments(self, parser):
        parser.add_argument("cluster", help="Registered cluster name.")
        parser.add_argument("node", help="Kubernetes node name.")

    def handle(self, *args, cluster, node, **options):
        if not Cluster.objects.filter(name=cluster).exists():
            raise CommandError(f"no registered cluster named {cluster!r} (manage.py register_cluster)")
        if not node.strip():
            raise CommandError("NODE must be a node name")
        self.stdout.write(node_key(settings.AGENT_SIGNING_SECRET, cluster, node).hex())
