"""Fixtures of the monitoring tests (helpers live in monitoring_helpers.py)."""

import pytest
from monitoring_helpers import Fleet, build_fleet


@pytest.fixture
def fleet(db) -> Fleet:
    """One node: an H100 with MIG (3g.40gb, 2g.20gb, 1g.10gb) and an H100 without."""
    return build_fleet()
