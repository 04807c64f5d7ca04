"""The demo world's screens agree on availability: the cross-check (gpuaas.dashboard.crosscheck) finds nothing.

When this was written the demo's prod cluster carried 1g.10gb and 2g.20gb instances on tier-1 nodes, which
the tier profile policy withholds (tier 1 takes 3g and larger): the dashboard showed them Available while
approval, the form's check and the forecast counted none of them.
"""

import io

import pytest

from gpuaas.dashboard import crosscheck
from gpuaas.demo import world as demo_world

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


def test_every_screen_agrees_on_every_profile_of_every_demo_node(simcluster, settings):
    settings.KUBERNETES_RETRIES = 0
    sim = simcluster("demo")
    kube_dir = next(iter(sim.kubeconfigs.values())).parent
    operator, member = demo_world._users()
    clusters = demo_world._clusters(kube_dir, io.StringIO())
    demo_world._requests(operator, demo_world._projects(member), clusters, io.StringIO())
    assert crosscheck.contradictions() == []
