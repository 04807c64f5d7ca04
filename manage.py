#!/usr/bin/env python
"""Django's command-line utility for gpuaas."""

import os
import sys

from gpuaas.demo.env import demo_environment


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuaas.settings")
    if sys.argv[1:2] in (["demo"], ["bench"]):  # both run against the simulated cluster
        demo_environment()  # DEBUG=1 and per-install keys under var/, before settings are read
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
