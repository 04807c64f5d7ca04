"""The dashboard tests' small world (tests/dashboard/dashboard_world.py describes it unit by unit)."""

import pytest
from dashboard_world import build_world


@pytest.fixture
def world(project, other_project):
    return build_world(project, other_project)
