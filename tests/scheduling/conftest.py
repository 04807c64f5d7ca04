"""Fixtures of the scheduling tests: the pools tests' small fleet, API clients and request maker, shared (the queue
works on pools' rows). tests/pools/conftest.py is loaded under its own name so both folders keep `conftest`, and
tests/pools is on the path for the helpers the queue's tests share (run_concurrently)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pools"))
_path = Path(__file__).resolve().parents[1] / "pools" / "conftest.py"
_spec = importlib.util.spec_from_file_location("pools_conftest", _path)
pools_conftest = sys.modules.get("pools_conftest") or importlib.util.module_from_spec(_spec)
if "pools_conftest" not in sys.modules:
    sys.modules["pools_conftest"] = pools_conftest
    _spec.loader.exec_module(pools_conftest)

Fleet = pools_conftest.Fleet
kube_for = pools_conftest.kube_for
fast_password_hashing = pools_conftest.fast_password_hashing
fleet = pools_conftest.fleet
api = pools_conftest.api
make_request = pools_conftest.make_request
sim = pools_conftest.sim
