"""Temporary: pools/units/topology.py's old path, for the modules moving to the scheduling app (forecast,
procurement) until their imports follow (/work/notes/poolsplit_sed.sh); then delete this file."""

from .units.topology import *  # noqa: F403
