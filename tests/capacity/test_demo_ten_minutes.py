"""A `make demo` world left alone for ten minutes shows 0 open trespass events; a real trespass injected into the
simulator (its `trespass` fault, over HTTP as a user would) shows exactly one, at the first trespass check after
the injection: the metric poll that sees the node's pod -> device set change queues the cluster's discovery at
once (monitoring.services.reports), run here in-process as its task would run it.

The ten minutes are driven on the simulator's clock at the beat periods the demo runs with (discovery every
DISCOVERY_INTERVAL_S, a metric poll and trespass check every METRICS_INTERVAL_S, the settings' defaults), not
waited for. Marked slow: the seeding alone takes minutes (`make test-slow`). The same figure measured against a
real `make demo` left running for ten minutes is in docs/demo.md.
"""

import io
import json
import urllib.request
from datetime import timedelta

import pytest
from demo_claims import detect_all_trespass, poll_all
from django.utils import timezone

from capacity.models import Cluster
from capacity.services.discovery import discover_cluster
from gpuaas.demo import world as demo_world
from monitoring.models import TrespassEvent
from monitoring.services import reports

pytestmark = [pytest.mark.django_db, pytest.mark.slow, pytest.mark.usefixtures("retry_waits")]

TEN_MINUTES_S = 600


@pytest.fixture
def world(simcluster, settings, monkeypatch):
    settings.KUBERNETES_RETRIES = 0
    monkeypatch.setattr(demo_world, "HISTORY_S", 13 * 3600)  # as tests/capacity/test_demo_world.py: a shorter past
    sim = simcluster("demo")
    kube_dir = next(iter(sim.kubeconfigs.values())).parent
    demo_world.seed(kube_dir=kube_dir, stdout=io.StringIO())
    # The discovery a poll queues (discover_cluster_task), run in-process with the inventory inline, as the demo's.
    monkeypatch.setattr(
        reports,
        "queue_discovery",
        lambda cluster_id: discover_cluster(cluster_id, inventory=demo_world.INVENTORY_INLINE),
    )
    return sim


def beat(world, start, seconds: int, settings, capture, *, on_check=None) -> None:
    """Run what beat runs for `seconds` of simulated time from `start`: discovery every DISCOVERY_INTERVAL_S, a
    poll of every node and a trespass check on every cluster every METRICS_INTERVAL_S. `on_check(at)` is called
    after each trespass check; `capture` runs what a poll's ingest leaves for after commit (a queued discovery)."""
    clusters = {c.name: c for c in Cluster.objects.all()}
    step = settings.METRICS_INTERVAL_S
    for elapsed in range(step, seconds + 1, step):
        at = start + timedelta(seconds=elapsed)
        if elapsed % settings.DISCOVERY_INTERVAL_S == 0:
            demo_world._rediscover(clusters)
        with capture(execute=True):
            poll_all(at, world)
        detect_all_trespass(at)
        if on_check is not None:
            on_check(at)


def inject(world, cluster: str, node: str) -> dict:
    url = world.server.cluster_url(cluster) + "/sim/v1/faults"
    body = json.dumps({"fault": "trespass", "node": node, "pod": "miner"}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def test_ten_quiet_minutes_then_one_real_trespass_is_exactly_one_event(
    world, settings, django_capture_on_commit_callbacks
):
    # The periods users run: the settings' defaults, nothing overridden for this test.
    assert (settings.METRICS_INTERVAL_S, settings.DISCOVERY_INTERVAL_S, settings.MONITORING_TRESPASS_POLLS) == (
        30,
        60,
        3,
    )
    start = timezone.now()
    open_counts = []
    beat(
        world,
        start,
        TEN_MINUTES_S,
        settings,
        django_capture_on_commit_callbacks,
        on_check=lambda at: open_counts.append(TrespassEvent.objects.open().count()),
    )
    assert len(open_counts) == TEN_MINUTES_S // settings.METRICS_INTERVAL_S == 20
    assert set(open_counts) == {0}
    assert TrespassEvent.objects.count() == 0  # none opened and closed in between either

    injected = inject(world, "prod", "prod-h100-full-02")
    assert injected["pod"] == "intruder/miner" and len(injected["devices"]) == 1
    after = start + timedelta(seconds=TEN_MINUTES_S)
    seen: list[tuple[int, int]] = []  # (seconds after the injection, open events) at each check

    def check(at):
        seen.append((int((at - after).total_seconds()), TrespassEvent.objects.open().count()))

    beat(
        world,
        after,
        settings.DISCOVERY_INTERVAL_S + settings.MONITORING_TRESPASS_POLLS * 30,
        settings,
        django_capture_on_commit_callbacks,
        on_check=check,
    )
    # The first check after the injection has it: the poll saw the node's pod set change, not the next discovery.
    first = next(s for s, n in seen if n)
    assert first == settings.METRICS_INTERVAL_S < settings.DISCOVERY_INTERVAL_S
    assert [n for s, n in seen if s >= first] == [1] * len([s for s, n in seen if s >= first])
    (event,) = TrespassEvent.objects.open()
    assert (event.kind, event.namespace, event.pod_name, event.gpu.node.name) == (
        "unallocated_pod",
        "intruder",
        "miner",
        "prod-h100-full-02",
    )
    assert event.gpu.uuid == injected["devices"][0]
