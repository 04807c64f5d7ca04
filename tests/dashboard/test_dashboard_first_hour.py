"""The small defects a newcomer met in the first hour (issue 27, item 4), each proven on the page it was on."""

import io
import re
from datetime import UTC, datetime

import pytest
from dashboard_world import _gpu, _node
from django.urls import reverse

from capacity.models import Cluster
from gpuaas.management.commands import demo
from monitoring.models import TrespassEvent
from pools.api.serializers import TOO_MANY_UNITS
from pools.models import PoolRequest

pytestmark = pytest.mark.django_db

FORM = {"name": "big", "workload_type": "training", "isolation": "full", "product": "H100-80GB"}


def _title(response) -> str:
    return re.search(r"<title>(.*?)</title>", response.content.decode(), re.S).group(1)


@pytest.mark.parametrize(
    ("url", "title"), [("/projects/", "My projects | gpuaas"), ("/projects/team-a/", "Team A | gpuaas")]
)
def test_the_tab_title_is_text_not_html(client, bob, url, title):
    client.force_login(bob)
    assert _title(client.get(url)) == title


def test_the_best_effort_section_appears_once(client, bob):
    client.force_login(bob)
    assert client.get("/projects/team-a/").content.decode().count('<h2 id="gd-h-best-effort">') == 1


def test_trespass_since_is_a_date_and_time_like_the_rest_of_the_page(client, bob, project, other_project):
    node = _node(Cluster.objects.create(name="c", kubeconfig_path="/tmp/c"), "n1", "NVIDIA H100 80GB HBM3", 1)
    gpu = _gpu(node, 0, "NVIDIA H100 80GB HBM3", "H100-80GB", False)
    started = datetime(2026, 12, 6, 8, 41, 27, 123456, tzinfo=UTC)
    TrespassEvent.objects.create(
        kind="foreign_pod", gpu=gpu, unit_key=f"gpu:{gpu.pk}", owner_project=project, project=other_project,
        namespace="team-b", pod_name="sneaky", started_at=started,
    )  # fmt: skip
    client.force_login(bob)
    html = client.get("/projects/team-a/").content.decode()
    trespass = html[html.index('data-region="trespass"') :]
    assert '<time datetime="2026-12-06T08:41:27.123456+00:00">2026-12-06 08:41</time>' in trespass
    assert "2026-12-06T08:41:27" not in trespass.split("<time")[1].split(">", 1)[1]


def test_the_form_caps_count_where_the_api_does(client, bob, settings):
    settings.POOL_REQUEST_MAX_UNITS = 8  # read when the form is built, as the API reads it when it validates
    client.force_login(bob)
    page = client.get("/projects/team-a/requests/new/").content.decode()
    assert re.search(r'<input type="number" name="count"[^>]* max="8"', page)
    refused = client.post("/projects/team-a/requests/new/", FORM | {"count": "9", "create": "1"})
    assert refused.context["form"].errors == {"count": [TOO_MANY_UNITS.format(max_value=8)]}
    assert client.post("/projects/team-a/requests/new/", FORM | {"count": "8", "create": "1"}).status_code == 302
    assert PoolRequest.objects.get().count == 8


def test_until_says_what_the_widget_takes_and_keeps_it_on_redisplay(client, bob):
    client.force_login(bob)
    field = client.get("/projects/team-a/requests/new/").context["form"]["end_at"]
    assert 'type="datetime-local"' in str(field)
    assert "UTC" in field.help_text and "YYYY" not in field.help_text
    # A datetime-local input sends 2026-12-31T18:30; a re-displayed form gives it back in that format.
    redisplay = client.post("/projects/team-a/requests/new/", FORM | {"count": "0", "end_at": "2099-12-31T18:30"})
    assert 'value="2099-12-31T18:30"' in str(redisplay.context["form"]["end_at"])


def test_rebalance_defaults_to_the_product_the_fleet_is_made_of(client, operator):
    cluster = Cluster.objects.create(name="c", kubeconfig_path="/tmp/c")
    h200 = _node(cluster, "h200", "NVIDIA H200", 3)
    for index in range(3):
        _gpu(h200, index, "NVIDIA H200", "H200-141GB", False)
    _gpu(_node(cluster, "h100", "NVIDIA H100 80GB HBM3", 1), 0, "NVIDIA H100 80GB HBM3", "H100-80GB", False)
    client.force_login(operator)
    form = client.get(reverse("admin:capacity_rebalance")).context["form"]
    assert form["product"].value() == "H200-141GB"


def test_a_member_opening_the_admin_is_told_it_is_for_operators(client, bob):
    client.force_login(bob)
    response = client.get("/admin/", follow=True)
    assert response.status_code == 403
    html = response.content.decode()
    assert "This is for operators" in html and 'href="/projects/"' in html
    assert 'name="password"' not in html  # no second login form


def test_anonymous_visitors_still_get_the_admin_login(client):
    response = client.get("/admin/", follow=True)
    assert response.status_code == 200 and 'name="password"' in response.content.decode()


class _Supervisor:
    """What the demo asks of its process manager (gpuaas.demo.processes.Supervisord), without supervisord."""

    def __init__(self):
        self.programs = {}

    def start(self):
        return None

    def add(self, program):
        self.programs[program.name] = program
        return program

    def run(self, every_tick=None):
        return None


def test_the_demo_names_every_process_it_starts_the_ingest_worker_included(monkeypatch, tmp_path):
    from gpuaas.demo import world as demo_world

    monkeypatch.setattr(demo, "call_command", lambda *a, **k: None)
    monkeypatch.setattr(demo_world, "seed", lambda **k: {"operator": "op / pw", "member": "bob / pw"})
    monkeypatch.setattr(demo_world, "node_queues", lambda: [])
    command = demo.Command(stdout=io.StringIO())
    command.supervisor = _Supervisor()
    monkeypatch.setattr(command, "_wait_for_port", lambda *a, **k: None)
    command._run(False, 6443, 8000)
    out = command.stdout.getvalue()
    assert list(command.supervisor.programs) == ["simcluster", "worker", "beat", "ingest", "web"]
    for name in command.supervisor.programs:
        assert f"  {name}:" in out
    assert "ingest worker (manage.py ingest-worker)" in out


def test_every_trend_chart_spans_the_window_and_says_when_a_late_metric_begins(
    client, operator, project, other_project
):
    from dashboard_world import add_signals, build_world

    from monitoring.models import Rollup5m

    world = build_world(project, other_project)
    add_signals(world)
    client.force_login(operator)
    series = client.get("/admin/dashboard/data.json").json()["series"]
    span = datetime.fromisoformat(series["to"]) - datetime.fromisoformat(series["from"])
    assert span.total_seconds() == 3 * 3600
    (alpha,) = [line for line in series["series"] if line["label"] == "alpha"]
    assert sum(p["gpu_util_pct"] is not None for p in alpha["points"]) == 12  # the utilisation series, whole
    assert "readings begin" not in series["summary"]

    # Utilisation recorded only in the newest bucket (history seeded without it): drawn where it begins, and said.
    buckets = sorted(Rollup5m.objects.values_list("bucket", flat=True).distinct())
    Rollup5m.objects.filter(bucket__lt=buckets[-1]).update(gpu_util_avg=None)
    series = client.get("/admin/dashboard/data.json").json()["series"]
    assert f"Utilisation readings begin at {buckets[-1]:%H:%M}." in series["summary"]
