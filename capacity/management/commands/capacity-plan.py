"""`python manage.py capacity-plan`: slots per tier for N GPUs (the seed's capacity arithmetic).

    manage.py capacity-plan --product H100-80GB --gpus 8 --layout 4g.40gb,3g.40gb [--timeslice-replicas 4] [--json]

The module name has a hyphen so that the command reads as documented; Django finds commands with
pkgutil and imports them by that name, which a hyphen does not disturb.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from capacity.choices import Tier
from capacity.mig.tiers import capacity_plan


class Command(BaseCommand):
    help = "Slots per virtualisation tier for N GPUs of one product: MIG layout, time-slicing or whole GPUs."

    def add_arguments(self, parser):
        parser.add_argument("--product", required=True, help='Catalog key or GFD product, e.g. "H100-80GB".')
        parser.add_argument("--gpus", required=True, type=int, help="Number of physical GPUs.")
        parser.add_argument("--layout", help='Per-GPU MIG layout for tier 1, e.g. "4g.40gb,3g.40gb".')
        parser.add_argument("--timeslice-replicas", type=int, help="Device-plugin replicas per GPU for tier 3.")
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print JSON.")

    def handle(self, *args, product, gpus, layout=None, timeslice_replicas=None, as_json=False, **options):
        try:
            plan = capacity_plan(product, gpus, layout=layout, timeslice_replicas=timeslice_replicas)
        except (KeyError, ValueError) as exc:
            raise CommandError(exc.args[0]) from None
        if as_json:
            self.stdout.write(json.dumps(plan))
            return
        self.stdout.write(f"{plan['gpus']} x {plan['product']}")
        for tier, figures in plan["tiers"].items():
            specs = ", ".join(f"{spec} x {count}" for spec, count in figures["by_spec"].items())
            self.stdout.write(f"  {Tier(tier).label}: {figures['slots']} slots ({specs})")
