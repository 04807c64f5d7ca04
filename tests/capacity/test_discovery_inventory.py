"""The node agent's inventory reconciled into GpuCapacity and MigInstance rows."""

import copy
import json
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest

from capacity.adapters import kubernetes as kube
from capacity.adapters import nvml
from capacity.agent import node as agent
from capacity.agent import protocol
from capacity.agent import tasks as agent_tasks
from capacity.models import GpuCapacity, MigInstance, MigPlacement, NodeCapacity
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import ingest_inventory_reports, inventory_node, reconcile_inventory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]

NODE = "prod-h100-bal-01"


@pytest.fixture
def sim(simcluster):
    sim = simcluster("demo")
    sim.register("prod")
    assert discover_cluster(sim.clusters["prod"].pk, inventory="none").run.status == "succeeded"
    return sim


def test_mig_instances_point_at_the_catalog_placement_they_occupy(sim):
    result = inventory_node(sim.clusters["prod"].pk, NODE)
    assert (result.nodes, result.gpus, result.mig_instances, result.errors) == (1, 8, 32, {})
    hardware = sim.state.cluster("prod").nodes[NODE]
    for real in hardware.gpus:
        rows = {
            m.uuid: m
            for m in MigInstance.objects.active().filter(gpu__uuid=real.uuid).select_related("placement", "profile")
        }
        expected = {
            ci.uuid: (gi.profile.name, gi.start, gi.profile.memory_slices, gi.id, ci.id)
            for gi, ci in real.mig_devices()
        }
        assert {
            u: (m.profile.name, m.placement_start, m.placement_size, m.gi_id, m.ci_id) for u, m in rows.items()
        } == expected
        for m in rows.values():
            assert (m.placement.profile_id, m.placement.start, m.placement.size) == (
                m.profile_id,
                m.placement_start,
                m.placement_size,
            )
            m.full_clean()  # overlap, product and placement rules hold
    assert MigPlacement.objects.filter(instances__gpu__node__name=NODE).count() == 32


def test_the_agents_report_is_the_same_inventory_and_is_idempotent(sim):
    """The node agent's task reads and publishes; the ingest worker's reconcile writes what inventory_node writes."""
    cluster = sim.clusters["prod"]
    sent = []
    with mock.patch.object(agent_tasks.transport, "publish", sent.append):
        assert agent_tasks.read_node_inventory_task(cluster.name, NODE, kube.api_url_for(cluster)) == 8
    results, refused = ingest_inventory_reports(json.loads(json.dumps(sent)))  # as the broker hands it over
    assert refused == []
    assert (results[cluster.name].gpus, results[cluster.name].mig_instances, results[cluster.name].errors) == (
        8,
        32,
        {},
    )
    ids = sorted(GpuCapacity.objects.filter(node__name=NODE).values_list("id", flat=True))
    again = inventory_node(cluster.pk, NODE)
    assert (again.gpus_written, again.mig_written, again.gpus_lost, again.mig_gone) == (0, 0, 0, 0)
    assert sorted(GpuCapacity.objects.filter(node__name=NODE).values_list("id", flat=True)) == ids
    forged = {**sent[0], "node": "another-node"}
    assert ingest_inventory_reports([forged])[1] == [
        f"{cluster.name}/another-node: signature does not match node {cluster.name}/another-node"
    ]
    assert inventory_node(cluster.pk, "not-a-node").nodes == 0


def test_a_gpu_that_is_no_longer_enumerated_is_lost_and_a_replacement_gets_a_new_row(sim):
    cluster = sim.clusters["prod"]
    inventory = nvml.node_inventory(sim.url("prod"), NODE)
    reconcile_inventory(cluster.pk, [inventory])
    old_uuid = inventory.gpus[7].uuid

    fewer = copy.deepcopy(inventory)
    fewer.gpus = fewer.gpus[:7]  # GPU 7 fell off the bus so hard NVML no longer lists it
    result = reconcile_inventory(cluster.pk, [fewer])
    vanished = GpuCapacity.objects.get(uuid=old_uuid)
    assert (result.gpus_lost, result.mig_gone, vanished.health, vanished.lost_at is not None) == (1, 4, "lost", True)
    assert set(vanished.mig_instances.values_list("state", flat=True)) == {"gone"}

    replaced = copy.deepcopy(inventory)
    replaced.gpus[7].uuid = "GPU-replacement-0001"
    replaced.gpus[7].mig_current = False
    replaced.gpus[7].mig_devices = []
    result = reconcile_inventory(cluster.pk, [replaced])
    assert GpuCapacity.objects.filter(node__name=NODE).count() == 9
    assert GpuCapacity.objects.filter(node__name=NODE).present().count() == 8
    new = GpuCapacity.objects.get(uuid="GPU-replacement-0001")
    assert (new.index, new.health, new.lost_at, new.mig_mode_current) == (7, "ok", None, False)
    assert GpuCapacity.objects.get(uuid=old_uuid).lost_at is not None


def test_a_node_that_is_gone_is_not_inventoried(sim):
    cluster = sim.clusters["prod"]
    NodeCapacity.objects.filter(name=NODE).update(gone_at="2026-01-01T00:00:00Z")
    assert inventory_node(cluster.pk, NODE).nodes == 0
    assert not GpuCapacity.objects.filter(node__name=NODE).exists()


def test_nvml_failures_are_reported_per_node_not_raised(sim, settings):
    settings.NVML_LIBRARY = "capacity.adapters.nvml.no_such_factory"
    result = inventory_node(sim.clusters["prod"].pk, NODE)
    assert list(result.errors) == [NODE]
    assert result.nodes == 0


def test_each_node_is_dated_with_the_read_its_rows_show_and_a_failed_read_says_why(sim, settings):
    """NodeCapacity.inventory_read_at is the report's read time (its slot), set in the reconcile's transaction;
    a failed read leaves it and the rows as they were and records the error until a read works again."""
    cluster, working = sim.clusters["prod"], settings.NVML_LIBRARY
    other = "prod-h100-bal-02"
    reports = [agent.read_inventory(cluster.name, name, api_url=kube.api_url_for(cluster)) for name in (NODE, other)]
    reports[1] = protocol.sign(protocol.KIND_INVENTORY, cluster.name, other, reports[1]["slot"] - 7, reports[1]["body"])

    assert ingest_inventory_reports(reports)[1] == []

    read = dict(NodeCapacity.objects.filter(name__in=[NODE, other]).values_list("name", "inventory_read_at"))
    assert read == {
        NODE: datetime.fromtimestamp(reports[0]["slot"], tz=UTC),
        other: datetime.fromtimestamp(reports[1]["slot"], tz=UTC),
    }
    settings.NVML_LIBRARY = "capacity.adapters.nvml.no_such_factory"
    failed = agent.read_inventory(cluster.name, NODE, api_url=kube.api_url_for(cluster))
    assert ingest_inventory_reports([failed])[1] == []
    node = NodeCapacity.objects.get(name=NODE)
    assert node.inventory_read_at == read[NODE]
    assert node.inventory_error == failed["body"]["error"] != ""
    assert not node.inventory_read_since(read[NODE] + timedelta(seconds=1))

    settings.NVML_LIBRARY = working
    again = agent.read_inventory(cluster.name, NODE, api_url=kube.api_url_for(cluster))
    assert ingest_inventory_reports([again])[1] == []
    node.refresh_from_db()
    assert (node.inventory_read_at, node.inventory_error) == (datetime.fromtimestamp(again["slot"], tz=UTC), "")


def test_an_unprivileged_agent_gives_a_partial_inventory_with_a_warning_naming_the_privilege(sim, settings):
    """#14 item 4: NVML_ERROR_NO_PERMISSION from nvmlDeviceGetGpuInstanceById no longer fails the whole node."""
    cluster = sim.clusters["prod"]
    assert inventory_node(cluster.pk, NODE).mig_instances == 32  # a privileged agent recorded the layout
    before = dict(MigInstance.objects.active().filter(gpu__node__name=NODE).values_list("uuid", "placement_id"))

    settings.NVML_LIBRARY = "simcluster.nvml.unprivileged_library_for_node"
    result = inventory_node(cluster.pk, NODE)

    assert (result.errors, result.gpus, result.gpus_lost, result.mig_gone, result.mig_written) == ({}, 8, 0, 0, 0)
    [warning] = result.warnings[NODE]
    assert "nvmlDeviceGetGpuInstanceById (NVML_ERROR_NO_PERMISSION)" in warning
    assert "root" in warning and "/proc/driver/nvidia/capabilities/mig/monitor" in warning
    assert GpuCapacity.objects.filter(node__name=NODE, health="ok").count() == 8  # the GPUs were read
    after = dict(MigInstance.objects.active().filter(gpu__node__name=NODE).values_list("uuid", "placement_id"))
    assert after == before  # placements it could not read are kept, not marked gone


def test_a_gpu_nvml_fails_part_way_through_is_kept_as_it_was_and_named_in_a_warning(sim):
    cluster = sim.clusters["prod"]
    inventory = nvml.node_inventory(sim.url("prod"), NODE)
    reconcile_inventory(cluster.pk, [inventory])
    partial = copy.deepcopy(inventory)
    gpu = partial.gpus[3]
    gpu.name, gpu.memory_mib, gpu.mig_current, gpu.mig_devices = "", None, False, []
    gpu.error = "NVML error while reading GPU 3: Unknown Error"
    row = GpuCapacity.objects.get(uuid=gpu.uuid)

    result = reconcile_inventory(cluster.pk, [partial])

    assert (result.gpus_lost, result.mig_gone, result.gpus_written) == (0, 0, 0)
    row.refresh_from_db()
    assert (row.health, row.product, row.memory_mib, row.mig_mode_current) == (
        "ok",
        "NVIDIA H100 80GB HBM3",
        81559,
        True,
    )
    assert row.mig_instances.filter(state="active").count() == 4
