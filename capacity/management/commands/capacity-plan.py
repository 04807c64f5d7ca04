"""`python manage.py capacity-plan`: slots per tier for N GPUs (the seed's capacity arithmetic).

    manage.py capacity-plan --product H100-80GB --gpus 8 --layout 4g.40gb,3g.40gb [--timeslice-replicas 4] [--json]
    manage.py capacity-plan --live [--json]      # the live fleet per tier (capacity.services.planning.tier_plan)

The module name has a hyphen so that the command reads as documented; Django finds commands with
pkgutil and imports them by that name, which a hyphen does not disturb.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from capacity.choices import Tier
from capacity.mig.tiers import capacity_plan
from capacity.services.planning import tier_plan


class Command(BaseCommand):
    help = "Slots per virtualisation tier for N GPUs of one product: MIG layout, time-slicing or whole GPUs."

    def add_arguments(self, parser):
        parser.add_argument("--live", action="store_true", help="The discovered fleet's units per tier instead.")
        parser.add_argument("--product", help='Catalog key or GFD product, e.g. "H100-80GB".')
        parser.add_argument("--gpus", type=int, help="Number of physical GPUs.")
        parser.add_argument("--layout", help='Per-GPU MIG layout for tier 1, e.g. "4g.40gb,3g.40gb".')
        parser.add_argument("--timeslice-replicas", type=int, help="Device-plugin replicas per GPU for tier 3.")
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print JSON.")

    def handle(
        self, *args, product=None, gpus=None, layout=None, timeslice_replicas=None, as_json=False, live=False, **options
    ):
        if live:
            self._live(as_json)
            return
        if not product or gpus is None:
            raise CommandError("Give --product and --gpus for a proposal, or --live for the discovered fleet.")
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

    def _live(self, as_json: bool) -> None:
        plan = tier_plan()
        if as_json:
            self.stdout.write(json.dumps(plan.as_dict()))
            return
        self.stdout.write(f"maintenance reserve: {plan.reserve_gpus} GPU(s) per cluster and tier")
        for t in plan.tiers:
            self.stdout.write(
                f"  {t.label} ({t.rule}): {t.total} units on {t.gpus} GPUs, {t.reserved} reserved, {t.free} free,"
                f" {t.unavailable} unavailable, {t.withheld} withheld by tier policy, reserve {t.reserve},"
                f" {t.free_after_reserve} free after it"
            )
