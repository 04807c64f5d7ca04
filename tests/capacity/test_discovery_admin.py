"""The operator console for discovery: "Discover now", kubeconfig upload, node filters and counts."""

import pytest
from django.urls import reverse

from capacity.models import Cluster
from capacity.services.discovery import discover_cluster
from capacity.tasks import discover_cluster_task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


@pytest.fixture
def queued(monkeypatch):
    calls = []
    monkeypatch.setattr(discover_cluster_task, "apply_async", lambda args, **kw: calls.append((args, kw)))
    return calls


def test_discover_now_queues_the_selected_clusters_after_commit(
    client, operator, queued, django_capture_on_commit_callbacks
):
    a = Cluster.objects.create(name="a", kubeconfig_path="/k/a")
    b = Cluster.objects.create(name="b", kubeconfig_path="/k/b")
    Cluster.objects.create(name="c", kubeconfig_path="/k/c")
    client.force_login(operator)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        page = client.post(
            reverse("admin:capacity_cluster_changelist"),
            {"action": "discover_now", "_selected_action": [a.pk, b.pk]},
            follow=True,
        )
    assert page.status_code == 200
    assert "2 clusters queued for discovery." in [str(m) for m in page.context["messages"]]
    assert len(callbacks) == 1
    assert queued == [((a.pk,), {"expires": 60}), ((b.pk,), {"expires": 60})]


def test_a_pasted_kubeconfig_is_stored_encrypted_after_it_loads(client, operator, simcluster):
    sim = simcluster("demo")
    text = sim.kubeconfigs["dev"].read_text()
    client.force_login(operator)
    url = reverse("admin:capacity_cluster_add")
    bad = client.post(url, {"name": "dev", "kubeconfig_upload": "not: [a kubeconfig"})
    assert bad.status_code == 200 and not Cluster.objects.exists()
    assert "kubeconfig_upload" in bad.context["adminform"].form.errors
    assert client.post(url, {"name": "dev", "kubeconfig_upload": text}).status_code == 302
    dev = Cluster.objects.get(name="dev")
    assert text not in dev.encrypted_kubeconfig
    assert dev.kubeconfig_text() == text.strip()
    assert discover_cluster(dev.pk, inventory="none").run.status == "succeeded"


def test_node_changelist_filters_by_state_and_counts_gpus_and_mig_instances(client, operator, simcluster):
    sim = simcluster("demo")
    prod = sim.register("prod")["prod"]
    discover_cluster(prod.pk, inventory="inline")
    sim.faults.node_vanish("prod", "prod-h100-full-02")
    discover_cluster(prod.pk, inventory="none")
    client.force_login(operator)
    url = reverse("admin:capacity_nodecapacity_changelist")
    gone = client.get(url, {"state": "gone"})
    assert [n.name for n in gone.context["cl"].result_list] == ["prod-h100-full-02"]
    rows = {n.name: (n._gpus, n._migs) for n in client.get(url, {"state": "present"}).context["cl"].result_list}
    # tier 2: GPUs 0-5 carry 4g.40gb + 3g.40gb, GPUs 6-7 3g.40gb + 2g.20gb + 2 x 1g.10gb (demo.yaml)
    assert rows == {
        "prod-h100-4g3g-01": (8, 20),
        "prod-h100-4g3g-02": (8, 20),
        "prod-h100-bal-01": (8, 32),
        "prod-h100-bal-02": (8, 32),
        "prod-h100-full-01": (8, 0),
    }
    clusters = client.get(reverse("admin:capacity_cluster_changelist")).context["cl"].result_list
    assert [(c.name, c._nodes, c._gpus) for c in clusters] == [("prod", 5, 40)]
