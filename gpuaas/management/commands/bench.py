"""`python manage.py bench NAME [options]`: run a registered benchmark, print one JSON line last.

The line carries the benchmark's figures and the block of its targets (benchmarks.targets): each target's
value, bound, kind and whether it is met, then `correctness_met` and `targets_met`. The command exits 1
when a correctness target is missed (the figures are printed first); a missed performance target is
reported in the line only.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from benchmarks.registry import REGISTRY, load
from benchmarks.targets import block, unmet

# Django's own options, and call_command's stdout/stderr: not the benchmark's.
COMMON_OPTIONS = {
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
    "stdout",
    "stderr",
}


class Command(BaseCommand):
    help = "Run a benchmark; its figures and targets are printed as one JSON object on the last line."

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
        bench = REGISTRY[benchmark]
        own = {k: v for k, v in options.items() if k not in COMMON_OPTIONS}
        result = bench.run(stdout=self.stdout, **own)
        result = {**result, **block(result, bench.targets)}
        self.stdout.write(json.dumps(result, sort_keys=False, default=str))
        if not result["correctness_met"]:
            problems = ([f"error: {result['error']}"] if "error" in result else []) + unmet(result)
            raise CommandError(f"{benchmark}: correctness targets not met: {'; '.join(problems)}")
