"""`python manage.py bench NAME [options]`: run a registered benchmark, print one JSON line last."""

import json

from django.core.management.base import BaseCommand, CommandError

from benchmarks.registry import REGISTRY, load


class Command(BaseCommand):
    help = "Run a benchmark; its figures are printed as one JSON object on the last line."

    def create_parser(self, prog_name, subcommand, **kwargs):
        load()
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="benchmark", metavar="NAME", required=True)
        for name, bench in sorted(REGISTRY.items()):
            p = sub.add_parser(name, help=bench.help)
            for args, kwargs in bench.arguments:
                p.add_argument(*args, **kwargs)

    def handle(self, *args, benchmark, **options):
        if benchmark not in REGISTRY:
            raise CommandError(f"unknown benchmark {benchmark!r}; known: {', '.join(sorted(REGISTRY))}")
        own = {
            k: v
            for k, v in options.items()
            if k not in {"verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color", "skip_checks"}
        }
        result = REGISTRY[benchmark].run(stdout=self.stdout, **own)
        self.stdout.write(json.dumps(result, sort_keys=False))
