"""Management commands: register_cluster, discover, simcluster --register."""

import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from capacity.models import Cluster, GpuCapacity, NodeCapacity
from gpuaas.management.commands.simcluster import serve

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_register_cluster_validates_the_kubeconfig(simcluster, tmp_path):
    sim = simcluster("demo")
    with pytest.raises(CommandError, match="does not exist"):
        run("register_cluster", "prod", "--kubeconfig", str(tmp_path / "nope"))
    (tmp_path / "junk").write_text("{{{")
    with pytest.raises(CommandError, match="cannot read kubeconfig"):
        run("register_cluster", "prod", "--kubeconfig", str(tmp_path / "junk"))
    with pytest.raises(CommandError, match="has no context 'other'; it has: prod"):
        run("register_cluster", "prod", "--kubeconfig", str(sim.kubeconfigs["prod"]), "--context", "other")
    assert not Cluster.objects.exists()

    out = run("register_cluster", "prod", "--kubeconfig", str(sim.kubeconfigs["prod"]))
    cluster = Cluster.objects.get(name="prod")
    assert out.startswith(f"prod: registered ({sim.url('prod')}, kubeconfig ")
    assert (cluster.kubeconfig_path, cluster.api_endpoint) == (str(sim.kubeconfigs["prod"].resolve()), sim.url("prod"))
    assert run("register_cluster", "prod", "--kubeconfig", str(sim.kubeconfigs["prod"])).startswith("prod: updated")
    assert Cluster.objects.count() == 1


def test_discover_runs_synchronously_and_prints_a_summary(simcluster):
    sim = simcluster("demo")
    sim.register()
    out = run("discover", "--cluster", "prod")
    assert "prod: 6 GPU nodes (6 new, 0 changed, 0 gone, 0 not ready), 48 GPUs" in out
    assert "inventory: 6 nodes, 48 GPUs (0 lost), 104 MIG instances (0 gone)" in out
    assert "H100-80GB 3g.40gb x 32 (32 allocatable, nvidia.com/mig-3g.40gb)" in out
    assert GpuCapacity.objects.filter(node__cluster__name="prod").count() == 48
    assert not NodeCapacity.objects.filter(cluster__name="dev").exists()

    out = run("discover", "--no-inventory")
    assert "dev: 2 GPU nodes (2 new" in out and "prod: 6 GPU nodes (0 new, 0 changed" in out
    assert "inventory:" not in out
    assert not GpuCapacity.objects.filter(node__cluster__name="dev").exists()


def test_discover_names_the_known_clusters_and_fails_when_a_cluster_fails(simcluster, settings):
    with pytest.raises(CommandError, match="no clusters registered"):
        run("discover")
    sim = simcluster("demo")
    sim.register()
    with pytest.raises(CommandError, match="unknown cluster 'staging'; known clusters: dev, prod"):
        run("discover", "--cluster", "staging")
    settings.KUBERNETES_RETRIES = 0
    sim.faults.api_error(5, status=500, cluster="prod")
    out = StringIO()
    with pytest.raises(CommandError, match="discovery failed for 1 of 2 clusters: prod"):
        call_command("discover", "--no-inventory", stdout=out)
    assert "prod: failed: Unavailable:" in out.getvalue()
    assert "dev: 2 GPU nodes" in out.getvalue()


def test_simcluster_serves_and_registers_its_clusters(tmp_path):
    stop = threading.Event()
    lines = []

    def write(line):
        lines.append(line)
        if len(lines) == 2:
            stop.set()  # both clusters registered: stop serving

    argv = ["--scenario", "demo", "--port", "0", "--kubeconfig-dir", str(tmp_path), "--tick", "0"]
    assert serve(argv, register=True, stop=stop, write=write) == 0
    assert lines == [
        f"registered cluster prod -> {tmp_path / 'prod.kubeconfig'}",
        f"registered cluster dev -> {tmp_path / 'dev.kubeconfig'}",
    ]
    assert sorted(Cluster.objects.values_list("name", "kubeconfig_path")) == [
        ("dev", str((tmp_path / "dev.kubeconfig").resolve())),
        ("prod", str((tmp_path / "prod.kubeconfig").resolve())),
    ]
