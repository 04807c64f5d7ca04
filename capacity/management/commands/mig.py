"""`python manage.py mig validate|plan`: check a MIG layout, or plan the fewest GPUs for a demand.

    manage.py mig validate --product H100-80GB --layout 4g.40gb,3g.40gb [--json]
    manage.py mig plan --product H100-80GB --demand 3g.40gb=5,1g.10gb=9 [--json]

With --json an invalid layout is an answer ({"valid": false, ...}, exit 0); without it, an error.
"""

import json
from collections import Counter

from django.core.management.base import BaseCommand, CommandError

from capacity.mig.catalog import Product, get_product
from capacity.mig.layout import LayoutResult, parse_demand, parse_layout, validate_layout
from capacity.mig.planner import Plan, plan_fewest_gpus


class Command(BaseCommand):
    help = "Validate a MIG layout for one GPU, or plan per-GPU layouts for a demand on the fewest GPUs."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        validate = sub.add_parser("validate", help="Does this layout fit on one GPU, and where do its instances go?")
        validate.add_argument("--product", required=True, help='Catalog key or GFD product, e.g. "H100-80GB".')
        validate.add_argument("--layout", required=True, help='Per-GPU instances, e.g. "4g.40gb,1g.10gb=3".')
        validate.add_argument("--json", action="store_true", dest="as_json", help="Print JSON; invalid still exits 0.")
        plan = sub.add_parser("plan", help="Per-GPU layouts meeting a demand on the fewest GPUs.")
        plan.add_argument("--product", required=True, help='Catalog key or GFD product, e.g. "H100-80GB".')
        plan.add_argument("--demand", required=True, help='Instances wanted, e.g. "3g.40gb=5,1g.10gb=9".')
        plan.add_argument("--json", action="store_true", dest="as_json", help="Print JSON.")

    def handle(self, *args, action, product, as_json=False, **options):
        found = _product(product)
        if action == "validate":
            self._validate(found, options["layout"], as_json=as_json)
        else:
            self._plan(found, options["demand"], as_json=as_json)

    def _validate(self, product: Product, text: str, *, as_json: bool) -> None:
        try:
            names = parse_layout(text)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        result = validate_layout(product, names)
        if as_json:
            self.stdout.write(json.dumps(result.to_dict()))
            return
        if not result.valid:
            raise CommandError(f"{product.key}: invalid layout: {result.reason}")
        self.stdout.write(self.style.SUCCESS(f"{product.key}: valid layout"))
        self.stdout.write(_table(product, result))

    def _plan(self, product: Product, text: str, *, as_json: bool) -> None:
        try:
            plan = plan_fewest_gpus(product, parse_demand(text))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if as_json:
            self.stdout.write(json.dumps(plan.to_dict()))
            return
        self.stdout.write(_summary(plan))


def _product(name: str) -> Product:
    try:
        return get_product(name)
    except KeyError as exc:
        raise CommandError(exc.args[0]) from None


def _table(product: Product, result: LayoutResult) -> str:
    lines = [f"  {'PROFILE':<12} {'START':>5} {'SIZE':>4}  SLICES (of {product.memory_slices})"]
    for p in result.placements:
        bar = "".join("#" if p.start <= s < p.start + p.size else "." for s in range(product.memory_slices))
        lines.append(f"  {p.profile:<12} {p.start:>5} {p.size:>4}  {bar}")
    return "\n".join(lines)


def _summary(plan: Plan) -> str:
    proof = "optimal" if plan.optimal else f"lower bound {plan.lower_bound}"
    lines = [f"{plan.product}: {plan.gpus} GPUs ({proof})"]
    shapes = Counter(" ".join(f"{p.profile}@{p.start}" for p in layout) for layout in plan.layouts)
    for shape, count in shapes.items():
        lines.append(f"  {count:>5} x  {shape}")
    return "\n".join(lines)
