"""`python manage.py gpu-probe`: print, as JSON, what NVML says about this host's GPUs. Read-only.

    manage.py gpu-probe [--indent 2]
    manage.py gpu-probe --api-url http://127.0.0.1:8765 --node prod-h100-bal-01   # a simulated node

Run it on a GPU node to see the GPUs, their MIG instances and one round of metrics through the
NVML library settings.NVML_LIBRARY names (set NVML_LIBRARY=capacity.adapters.nvml.local_pynvml for
the host's libnvidia-ml.so.1). It changes nothing; docs/simcluster.md compares its output with the
simulator's. `--api-url`/`--node` only matter to the simulator's NVML factory.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from capacity.adapters.nvml import NvmlError
from capacity.adapters.nvml.probe import probe


class Command(BaseCommand):
    help = "Print this host's GPUs, MIG instances and one round of metrics as read through NVML (read-only)."
    requires_system_checks = []  # a node without the database can still be probed

    def add_arguments(self, parser):
        parser.add_argument("--api-url", default="", help="Simulator only: the simulated cluster's API URL.")
        parser.add_argument("--node", default="", help="Simulator only: the simulated node to probe.")
        parser.add_argument("--indent", type=int, default=2, help="JSON indent (0: one line).")

    def handle(self, *args, api_url="", node="", indent=2, **options):
        try:
            found = probe(api_url, node)
        except NvmlError as exc:
            raise CommandError(
                f"No usable NVIDIA driver: {exc}. Is the driver installed and loaded "
                "(libnvidia-ml.so.1 on the library path, the nvidia kernel module loaded)?"
            ) from None
        self.stdout.write(json.dumps(found, indent=indent or None, sort_keys=True))
