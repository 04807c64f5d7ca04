"""Which GPU and MIG instance rows an inventory keeps, moves, loses or refuses (#32, attribution), on a world unlike
a toy one: two clusters, GPU ids unlike MIG-instance ids, nodes of several GPUs whose indexes move, signed reports
refused by age. Each test asserts the rows and the counts the product records."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity.adapters import nvml, podresources
from capacity.agent import protocol
from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity
from capacity.services import inventory as inv
from capacity.services.inventory import ingest_inventory_reports, reconcile_inventory

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
NOW = 1_796_000_000  # the ingest worker's clock in these tests (epoch seconds)


class World:
    """west (pk 41): node w-gpu-01, three H100s without MIG. east (pk 57): node e-gpu-03, an H100 with MIG. GPU rows
    have ids from 9101 on, MIG instance rows the table's own (far below): no GPU id equals any MIG instance's."""

    def __init__(self):
        self.west = Cluster.objects.create(pk=41, name="west", kubeconfig_path="/tmp/west.kubeconfig")
        self.east = Cluster.objects.create(pk=57, name="east", kubeconfig_path="/tmp/east.kubeconfig")
        self.w_node = NodeCapacity.objects.create(pk=301, cluster=self.west, name="w-gpu-01", gpu_count=3)
        self.e_node = NodeCapacity.objects.create(pk=302, cluster=self.east, name="e-gpu-03", gpu_count=1)
        for gpu_pk, node, index, uuid in (
            (9101, self.w_node, 0, "GPU-7f00-west-a"),
            (9102, self.w_node, 1, "GPU-1c00-west-b"),
            (9103, self.w_node, 2, "GPU-4e00-west-c"),
            (9201, self.e_node, 0, "GPU-9a00-east-m"),
        ):
            GpuCapacity.objects.create(pk=gpu_pk, node=node, index=index, uuid=uuid, product=H100, memory_mib=81559)


@pytest.fixture
def world():
    return World()


def gpu(index, uuid, *, mig=False, devices=(), error="", health=nvml.HEALTH_OK, name=H100):
    return nvml.GpuInfo(
        index=index,
        health=health,
        uuid=uuid,
        name=name,
        serial=f"SN-{uuid[-6:]}",
        pci_bus_id=f"0000:{index + 0x18:02x}:00.0",
        memory_mib=81559,
        mig_current=mig,
        mig_devices=list(devices),
        error=error,
    )


def mig(uuid, gi, name, start, *, size=None):
    profile = MigProfile.objects.get(product="H100-80GB", name=name)
    real = profile.valid_placements.get(start=start).size
    return nvml.MigDeviceInfo(
        index=gi,
        uuid=uuid,
        gpu_instance_id=gi,
        compute_instance_id=0,
        profile_id=profile.profile_id,
        placement_start=start,
        placement_size=real if size is None else size,
        memory_mib=profile.memory_mib,
    )


def west(*gpus):
    return nvml.NodeInventory(node_name="w-gpu-01", driver_version="550.90.07", cuda_version="12.4", gpus=list(gpus))


def east(*gpus):
    return nvml.NodeInventory(node_name="e-gpu-03", driver_version="550.90.07", cuda_version="12.4", gpus=list(gpus))


def present(node):
    return sorted(GpuCapacity.objects.filter(node=node).present().values_list("index", "id", "uuid", "health"))


def active_instances():
    return sorted(MigInstance.objects.active().values_list("uuid", "gpu_id", "placement_start", "gi_id"))


def test_gpus_that_swap_indexes_keep_their_rows_and_are_not_counted_lost(world):
    reconcile_inventory(
        world.west.pk, [west(gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b"), gpu(2, "GPU-4e00-west-c"))]
    )
    GpuCapacity.objects.filter(pk=9102).update(health="warning")

    # The first two GPUs swap indexes (reported in index order); the third stays where it was.
    swapped = west(gpu(0, "GPU-1c00-west-b"), gpu(1, "GPU-7f00-west-a"), gpu(2, "GPU-4e00-west-c"))
    result = reconcile_inventory(world.west.pk, [swapped])

    assert (result.gpus, result.gpus_lost, result.gpus_written) == (3, 0, 2)
    assert present(world.w_node) == [
        (0, 9102, "GPU-1c00-west-b", "warning"),
        (1, 9101, "GPU-7f00-west-a", "ok"),
        (2, 9103, "GPU-4e00-west-c", "ok"),
    ]
    # Reported in the other order, they swap back: the same rows again, nothing lost.
    back = west(gpu(1, "GPU-1c00-west-b"), gpu(0, "GPU-7f00-west-a"), gpu(2, "GPU-4e00-west-c"))
    result = reconcile_inventory(world.west.pk, [back])
    assert (result.gpus_lost, result.gpus_written) == (0, 2)
    assert [row[:3] for row in present(world.w_node)] == [
        (0, 9101, "GPU-7f00-west-a"),
        (1, 9102, "GPU-1c00-west-b"),
        (2, 9103, "GPU-4e00-west-c"),
    ]


def test_a_mig_device_whose_placement_size_is_not_the_catalogs_is_not_recorded(world, caplog):
    devices = [
        mig("MIG-e-3g", 2, "3g.40gb", 4),
        mig("MIG-e-2g-short", 3, "2g.20gb", 0, size=1),  # the catalog's 2g.20gb at 0 spans 2 slices
        mig("MIG-e-1g-long", 9, "1g.10gb", 2, size=2),  # and its 1g.10gb at 2 spans 1
    ]
    with caplog.at_level(logging.WARNING, logger="capacity.services.inventory"):
        result = reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=devices))])

    assert (result.mig_instances, result.mig_written) == (1, 1)
    assert active_instances() == [("MIG-e-3g", 9201, 4, 2)]
    assert MigInstance.objects.get().pk != 9201
    assert sorted(r.getMessage().split(": MIG device ")[1].split(" ")[0] for r in caplog.records) == [
        "MIG-e-1g-long",
        "MIG-e-2g-short",
    ]


def test_a_removed_instance_is_gone_and_its_neighbours_stay_active(world):
    layout = [mig("MIG-e-3g", 2, "3g.40gb", 4), mig("MIG-e-2g", 3, "2g.20gb", 0), mig("MIG-e-1g", 9, "1g.10gb", 2)]
    reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=layout))])
    ids = dict(MigInstance.objects.values_list("uuid", "pk"))

    result = reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=layout[:2]))])

    assert (result.mig_instances, result.mig_gone, result.mig_written) == (2, 1, 0)
    gone = MigInstance.objects.get(uuid="MIG-e-1g")
    assert (gone.pk, gone.state, gone.gone_at is not None) == (ids["MIG-e-1g"], "gone", True)
    assert active_instances() == [("MIG-e-2g", 9201, 0, 3), ("MIG-e-3g", 9201, 4, 2)]
    assert MigInstance.objects.get(uuid="MIG-e-3g").pk == ids["MIG-e-3g"] != 9201


def test_a_new_gpu_read_part_way_records_neither_it_nor_the_mig_devices_read(world):
    """A GPU the database does not know, whose NVML read failed part-way: nothing of it is written, not even the
    MIG devices read before the failure, and the known GPU beside it is kept."""
    partial = gpu(1, "GPU-5500-east-new", mig=True, devices=[mig("MIG-e-new", 1, "7g.80gb", 0)], error="Unknown Error")
    result = reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m"), partial)])

    assert (result.gpus, result.gpus_lost, result.mig_instances) == (2, 0, 0)
    assert present(world.e_node) == [(0, 9201, "GPU-9a00-east-m", "ok")]
    assert not MigInstance.objects.exists()


def test_a_lost_gpu_is_counted_once_and_an_unknown_lost_gpu_not_at_all(world):
    lost = gpu(2, "GPU-4e00-west-c", health=nvml.HEALTH_LOST)
    stranger = gpu(3, "GPU-0000-never-seen", health=nvml.HEALTH_LOST)
    healthy = (gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b"))

    first = reconcile_inventory(world.west.pk, [west(*healthy, lost, stranger)])
    again = reconcile_inventory(world.west.pk, [west(*healthy, lost, stranger)])

    assert (first.gpus_lost, again.gpus_lost) == (1, 0)
    assert GpuCapacity.objects.get(pk=9103).health == "lost"
    assert not GpuCapacity.objects.filter(uuid="GPU-0000-never-seen").exists()
    assert [row[1] for row in present(world.w_node)] == [9101, 9102]


def _report(cluster, node, slot, inventory=None, *, error=""):
    return protocol.sign(protocol.KIND_INVENTORY, cluster, node, slot, protocol.inventory_body(inventory, error=error))


def test_reports_are_accepted_from_fifteen_minutes_old_to_a_minute_ahead_and_refusals_are_logged(world, caplog):
    one = west(gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b"), gpu(2, "GPU-4e00-west-c"))
    reports = [
        _report("west", "w-gpu-01", NOW - 15 * 60, one),  # the oldest accepted
        _report("east", "e-gpu-03", NOW + 60, east(gpu(0, "GPU-9a00-east-m"))),  # the furthest ahead accepted
        _report("west", "w-gpu-01", NOW - 15 * 60 - 1, one),
        _report("east", "e-gpu-03", NOW + 61, east(gpu(0, "GPU-9a00-east-m"))),
    ]
    with (
        mock.patch.object(inv.time, "time", return_value=float(NOW)),
        caplog.at_level(logging.WARNING, logger="capacity.services.inventory"),
    ):
        results, refused = ingest_inventory_reports(reports)

    assert sorted(results) == ["east", "west"]
    assert (results["west"].gpus, results["east"].gpus) == (3, 1)
    assert refused == [
        f"west/w-gpu-01: read at {NOW - 901}: outside the accepted window",
        f"east/e-gpu-03: read at {NOW + 61}: outside the accepted window",
    ]
    assert [r.getMessage() for r in caplog.records] == [f"node agent inventory refused: {why}" for why in refused]


def test_a_failed_reads_long_error_is_kept_to_its_first_500_characters(world):
    error = "NVML_ERROR_UNKNOWN: " + "x" * 600
    reports = [_report("west", "w-gpu-01", NOW, error=error)]
    with mock.patch.object(inv.time, "time", return_value=float(NOW)):
        results, refused = ingest_inventory_reports(reports)

    assert refused == [] and results["west"].errors == {"w-gpu-01": error}
    assert NodeCapacity.objects.get(pk=301).inventory_error == error[:500]
    assert NodeCapacity.objects.get(pk=302).inventory_error == ""


def _padded(world, inventory, padding):
    """`inventory` alone, or with `padding` more west nodes that report no GPU: over inv._BY_CLUSTER nodes in one
    batch, the reconcile reads the cluster's rows rather than the batch's nodes' (only how SQL reads them)."""
    NodeCapacity.objects.bulk_create(
        NodeCapacity(pk=700 + n, cluster=world.west, name=f"w-cpu-{n:02d}", gpu_count=0) for n in range(padding)
    )
    return [inventory, *(nvml.NodeInventory(node_name=f"w-cpu-{n:02d}") for n in range(padding))]


@pytest.mark.parametrize("padding", [0, inv._BY_CLUSTER])
def test_a_report_of_one_node_leaves_another_nodes_gpu_alone_in_a_small_batch_or_a_large_one(world, padding):
    """A GPU recorded on w-gpu-02, which is not in the batch, that w-gpu-01 reports lost: w-gpu-02's row is not
    touched (neither lost nor counted), whether the batch is one node or more than inv._BY_CLUSTER."""
    other = NodeCapacity.objects.create(pk=303, cluster=world.west, name="w-gpu-02", gpu_count=1)
    GpuCapacity.objects.create(pk=9104, node=other, index=0, uuid="GPU-b200-west-d", product=H100, health="warning")
    healthy = (gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b"), gpu(2, "GPU-4e00-west-c"))
    stale = gpu(3, "GPU-b200-west-d", health=nvml.HEALTH_LOST)

    result = reconcile_inventory(world.west.pk, _padded(world, west(*healthy, stale), padding))

    assert (result.nodes, result.gpus, result.gpus_lost) == (1 + padding, 4, 0)
    assert present(other) == [(0, 9104, "GPU-b200-west-d", "warning")]
    assert [row[1] for row in present(world.w_node)] == [9101, 9102, 9103]
    assert present(world.e_node) == [(0, 9201, "GPU-9a00-east-m", "ok")]


@pytest.mark.parametrize("padding", [0, inv._BY_CLUSTER])
def test_a_gpu_that_moved_from_a_node_outside_the_batch_keeps_its_row_and_starts_healthy(world, padding):
    """w-gpu-01 now enumerates the GPU recorded (with a warning) on w-gpu-02: its row moves to w-gpu-01 at the
    reported index, the same pk, and takes the health this read gives it, whatever the batch size."""
    other = NodeCapacity.objects.create(pk=303, cluster=world.west, name="w-gpu-02", gpu_count=1)
    GpuCapacity.objects.create(pk=9104, node=other, index=0, uuid="GPU-b200-west-d", product=H100, health="warning")
    moved = west(
        gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b"), gpu(2, "GPU-4e00-west-c"), gpu(3, "GPU-b200-west-d")
    )

    result = reconcile_inventory(world.west.pk, _padded(world, moved, padding))

    assert (result.gpus, result.gpus_lost) == (4, 0)
    assert present(other) == []
    assert present(world.w_node)[3] == (3, 9104, "GPU-b200-west-d", "ok")
    assert [row[1] for row in present(world.w_node)] == [9101, 9102, 9103, 9104]


def test_a_kubelet_error_is_the_nodes_inventory_error_cut_to_500_characters_and_its_warnings_follow_it(world):
    """The agent read NVML but not the kubelet's PodResources (a long error, and a warning besides): the node's
    inventory_error is the error's note, cut to 500 characters, never the warning; the result's warnings list the
    error's note first. The other cluster's node is not touched."""
    error = "rpc error: code = Unavailable desc = " + "y" * 600
    reading = podresources.PodResourcesReading(socket="/var/lib/kubelet/pod-resources/kubelet.sock", error=error)
    reading.warnings = ["GetAllocatableResources is not served by this kubelet"]
    body = protocol.inventory_body(west(gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b")), pod_resources=reading)

    result = inv.reconcile_reports(world.west.pk, [{"node": "w-gpu-01", "slot": NOW, "body": body}])

    assert result.warnings == {
        "w-gpu-01": [
            f"kubelet PodResources: {error}",
            "kubelet PodResources: GetAllocatableResources is not served by this kubelet",
        ]
    }
    assert NodeCapacity.objects.get(pk=301).inventory_error == f"kubelet PodResources: {error}"[:500]
    assert NodeCapacity.objects.get(pk=302).inventory_error == ""
    assert result.errors == {} and result.gpus == 2


def test_a_failed_read_does_not_stop_the_reports_after_it(world):
    """Two west nodes in one batch, the first one's read failed: the second is still reconciled and dated."""
    other = NodeCapacity.objects.create(pk=303, cluster=world.west, name="w-gpu-02", gpu_count=1)
    second = nvml.NodeInventory(node_name="w-gpu-02", gpus=[gpu(0, "GPU-b200-west-d")])
    reports = [
        {"node": "w-gpu-01", "slot": NOW, "body": protocol.inventory_body(None, error="NVML_ERROR_DRIVER_NOT_LOADED")},
        {"node": "w-gpu-02", "slot": NOW, "body": protocol.inventory_body(second)},
    ]

    result = inv.reconcile_reports(world.west.pk, reports)

    assert (result.errors, result.nodes, result.gpus) == ({"w-gpu-01": "NVML_ERROR_DRIVER_NOT_LOADED"}, 1, 1)
    assert [row[2] for row in present(other)] == ["GPU-b200-west-d"]
    assert NodeCapacity.objects.get(pk=303).inventory_read_at is not None
    assert NodeCapacity.objects.get(pk=301).inventory_read_at is None


def test_a_mig_gpu_after_a_gpu_without_mig_on_the_same_node_has_its_instances_recorded(world):
    devices = [mig("MIG-w-7g", 1, "7g.80gb", 0)]
    result = reconcile_inventory(
        world.west.pk, [west(gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b", mig=True, devices=devices))]
    )

    assert result.mig_instances == 1
    assert active_instances() == [("MIG-w-7g", 9102, 0, 1)]


def test_an_instance_whose_placement_is_unreadable_is_kept_and_the_devices_after_it_are_recorded(world):
    reconcile_inventory(
        world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=[mig("MIG-e-1g", 1, "1g.10gb", 0)]))]
    )
    unreadable = mig("MIG-e-1g", 1, "1g.10gb", 0)
    unreadable.placement_start = unreadable.placement_size = None  # an unprivileged agent
    devices = [unreadable, mig("MIG-e-3g", 2, "3g.40gb", 4)]

    result = reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=devices))])

    assert (result.mig_instances, result.mig_gone) == (1, 0)
    assert active_instances() == [("MIG-e-1g", 9201, 0, 1), ("MIG-e-3g", 9201, 4, 2)]


def test_a_recorded_instance_that_nvml_reads_otherwise_is_corrected_in_its_row(world):
    layout = [mig("MIG-e-3g", 2, "3g.40gb", 4)]
    reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=layout))])
    row = MigInstance.objects.get(uuid="MIG-e-3g")
    MigInstance.objects.filter(pk=row.pk).update(gi_id=5)  # recorded wrong (say, by an older agent)

    result = reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=layout))])

    assert (result.mig_instances, result.mig_written, result.mig_gone) == (1, 1, 0)
    assert active_instances() == [("MIG-e-3g", 9201, 4, 2)]
    assert MigInstance.objects.get(uuid="MIG-e-3g").pk == row.pk


def test_serial_and_pci_bus_id_are_recorded_cut_to_32_characters_and_empty_when_nvml_gives_none(world):
    long_serial = gpu(0, "GPU-7f00-west-a")
    long_serial.serial = "1652" + "0" * 40  # longer than the column
    long_serial.pci_bus_id = "00000000:18:00.0" + "f" * 24  # likewise
    unknown = gpu(1, "GPU-1c00-west-b")
    unknown.serial = unknown.pci_bus_id = None  # nvmlDeviceGetSerial / GetPciInfo not supported
    reconcile_inventory(world.west.pk, [west(long_serial, unknown, gpu(2, "GPU-4e00-west-c"))])

    rows = GpuCapacity.objects.filter(node=world.w_node).order_by("index").values_list("pk", "serial", "pci_bus_id")
    assert list(rows) == [
        (9101, ("1652" + "0" * 40)[:32], ("00000000:18:00.0" + "f" * 24)[:32]),
        (9102, "", ""),
        (9103, "SN-west-c", "0000:1a:00.0"),
    ]


def test_a_gpu_read_part_way_keeps_its_instances_but_one_read_at_the_same_start_replaces_the_old(world):
    """GPU 9201 is read part-way (an NVML error after its MIG devices): its recorded instances are kept, except the
    one at the start where NVML now shows another instance, which is gone and replaced."""
    layout = [mig("MIG-e-old", 1, "3g.40gb", 0), mig("MIG-e-3g", 2, "3g.40gb", 4)]
    reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=layout))])
    partial = gpu(0, "GPU-9a00-east-m", mig=True, devices=[mig("MIG-e-new", 3, "3g.40gb", 0)], error="Unknown Error")

    result = reconcile_inventory(world.east.pk, [east(partial)])

    assert (result.mig_instances, result.mig_gone) == (1, 1)
    assert active_instances() == [("MIG-e-3g", 9201, 4, 2), ("MIG-e-new", 9201, 0, 3)]
    assert MigInstance.objects.get(uuid="MIG-e-old").state == "gone"


@pytest.mark.parametrize("holder_pk", [303, 299], ids=["holder after the reporter", "holder before the reporter"])
@pytest.mark.parametrize("first", ["lost report first", "healthy report first"])
def test_a_node_cannot_lose_a_gpu_another_node_in_the_same_batch_reports_healthy(world, first, holder_pk):
    """w-gpu-01 (pk 301) still lists a GPU as lost that now sits, healthy and unchanged, on w-gpu-02 in the same
    batch: only the node that holds a GPU's row may lose it, so w-gpu-02's row stays present and nothing is counted
    lost, whichever report comes first and whether the holder's id is above or below the reporter's."""
    NodeCapacity.objects.create(pk=holder_pk, cluster=world.west, name="w-gpu-02", gpu_count=1)
    holder = nvml.NodeInventory(
        node_name="w-gpu-02", driver_version="550.90.07", cuda_version="12.4", gpus=[gpu(0, "GPU-b200-west-d")]
    )
    reconcile_inventory(world.west.pk, [holder])  # its row now matches the report: the batch writes nothing for it
    healthy = (gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b"), gpu(2, "GPU-4e00-west-c"))
    stale = west(*healthy, gpu(3, "GPU-b200-west-d", health=nvml.HEALTH_LOST))
    batch = [stale, holder] if first == "lost report first" else [holder, stale]

    result = reconcile_inventory(world.west.pk, batch)

    assert (result.gpus, result.gpus_lost) == (5, 0)
    held = GpuCapacity.objects.get(uuid="GPU-b200-west-d")
    assert (held.node_id, held.lost_at, held.health) == (holder_pk, None, "ok")
    assert [row[1] for row in present(world.w_node)] == [9101, 9102, 9103]


def test_the_gpus_listed_after_a_lost_one_are_still_reconciled(world):
    """A lost GPU at index 0 does not end the node's report: the GPUs after it stay present, and a new one after it
    is recorded."""
    report = west(
        gpu(0, "GPU-7f00-west-a", health=nvml.HEALTH_LOST),
        gpu(1, "GPU-1c00-west-b"),
        gpu(2, "GPU-4e00-west-c"),
        gpu(3, "GPU-d300-west-new"),
    )

    result = reconcile_inventory(world.west.pk, [report])

    assert (result.gpus, result.gpus_lost) == (4, 1)
    assert [row[2] for row in present(world.w_node)] == ["GPU-1c00-west-b", "GPU-4e00-west-c", "GPU-d300-west-new"]


def test_a_gpu_whose_memory_nvml_cannot_read_is_recorded_with_zero_memory(world):
    unread_memory = dataclasses.replace(gpu(3, "GPU-d300-west-new"), memory_mib=None)
    healthy = (gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b"), gpu(2, "GPU-4e00-west-c"))

    reconcile_inventory(world.west.pk, [west(*healthy, unread_memory)])

    assert GpuCapacity.objects.get(uuid="GPU-d300-west-new").memory_mib == 0
    assert GpuCapacity.objects.get(pk=9101).memory_mib == 81559


@pytest.mark.parametrize("padding, by_cluster", [(0, False), (49, False), (50, True)])
def test_a_batch_reads_its_own_nodes_rows_and_only_a_large_one_reads_the_clusters(world, padding, by_cluster):
    """A report of one node in a fleet's cluster of 1,250 nodes must not read 10,000 GPU rows; a batch of more than
    50 nodes (inv._BY_CLUSTER) reads the cluster's rows once instead of a list of ids that long. The three reads
    (nodes, GPUs, MIG instances) switch together, between 50 and 51 nodes."""
    batch = _padded(world, west(gpu(0, "GPU-7f00-west-a")), padding)

    with CaptureQueriesContext(connection) as queries:
        reconcile_inventory(world.west.pk, batch)

    def read(table):
        (sql,) = [q["sql"] for q in queries.captured_queries if q["sql"].startswith(f'SELECT "{table}".')]
        return sql

    reads = {
        "nodes": read("capacity_nodecapacity"),
        "gpus": read("capacity_gpucapacity"),
        "instances": read("capacity_miginstance"),
    }
    ids = {
        "nodes": '"capacity_nodecapacity"."name" IN (',
        "gpus": '"capacity_gpucapacity"."node_id" IN (',
        "instances": '"capacity_gpucapacity"."node_id" IN (',
    }
    for what, sql in reads.items():
        assert (ids[what] in sql) is not by_cluster, (what, sql)
        assert ('"capacity_nodecapacity"."cluster_id" = ' in sql) is (by_cluster or what == "nodes"), (what, sql)


def test_a_lost_gpu_that_is_enumerated_again_comes_back_healthy_and_keeps_its_row(world):
    """A GPU marked lost (fell off the bus) that NVML enumerates again: the same row, present, health "ok" (not the
    "lost" it was marked with); a GPU with a warning keeps its warning."""
    GpuCapacity.objects.filter(pk=9102).update(health="lost", lost_at=timezone.now())
    GpuCapacity.objects.filter(pk=9103).update(health="warning")

    result = reconcile_inventory(
        world.west.pk, [west(gpu(0, "GPU-7f00-west-a"), gpu(1, "GPU-1c00-west-b"), gpu(2, "GPU-4e00-west-c"))]
    )

    assert (result.gpus, result.gpus_lost) == (3, 0)
    assert present(world.w_node) == [
        (0, 9101, "GPU-7f00-west-a", "ok"),
        (1, 9102, "GPU-1c00-west-b", "ok"),
        (2, 9103, "GPU-4e00-west-c", "warning"),
    ]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_gpus_that_rotate_indexes_keep_their_rows_whatever_order_nvml_lists_them_in(world, order):
    """GPU a at 0, b at 1, c at 2 come back as c at 0, a at 1, b at 2: each index's old occupant must be let go
    before another GPU takes the index (one present GPU per node and index), whichever order the report lists
    them in and however their UUIDs sort."""
    rotated = [gpu(0, "GPU-4e00-west-c"), gpu(1, "GPU-7f00-west-a"), gpu(2, "GPU-1c00-west-b")]

    result = reconcile_inventory(world.west.pk, [west(*(rotated[i] for i in order))])

    assert (result.gpus, result.gpus_lost, result.gpus_written) == (3, 0, 3)
    assert [row[:3] for row in present(world.w_node)] == [
        (0, 9103, "GPU-4e00-west-c"),
        (1, 9101, "GPU-7f00-west-a"),
        (2, 9102, "GPU-1c00-west-b"),
    ]


def test_long_names_and_versions_are_cut_to_their_columns_and_an_unknown_product_has_no_catalogue_key(world):
    name, driver, cuda = "NVIDIA " + "X" * 120, "550.90.07" + "-custom" * 6, "12.4" + ".1" * 10
    odd = nvml.NodeInventory(
        node_name="w-gpu-01",
        driver_version=driver,
        cuda_version=cuda,
        gpus=[gpu(0, "GPU-7f00-west-a", name=name), gpu(1, "GPU-1c00-west-b"), gpu(2, "GPU-4e00-west-c")],
    )

    reconcile_inventory(world.west.pk, [odd])

    rows = GpuCapacity.objects.filter(node=world.w_node).order_by("index")
    fields = ("product", "catalog_product", "driver_version", "cuda_version")
    assert list(rows.values_list(*fields)) == [
        (name[:100], "", driver[:32], cuda[:16]),
        (H100, "H100-80GB", driver[:32], cuda[:16]),
        (H100, "H100-80GB", driver[:32], cuda[:16]),
    ]


def test_an_unchanged_instance_does_not_stop_the_ones_after_it_from_being_recorded(world):
    """East's GPU keeps its 3g.40gb at 4 as it was and gains a 1g.10gb at 0 and a 1g.10gb at 1, listed after it."""
    kept = mig("MIG-e-3g", 2, "3g.40gb", 4)
    reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=[kept]))])
    added = [mig("MIG-e-1g-a", 7, "1g.10gb", 0), mig("MIG-e-1g-b", 8, "1g.10gb", 1)]

    result = reconcile_inventory(world.east.pk, [east(gpu(0, "GPU-9a00-east-m", mig=True, devices=[kept, *added]))])

    assert (result.mig_instances, result.mig_gone, result.mig_written) == (3, 0, 2)
    assert active_instances() == [("MIG-e-1g-a", 9201, 0, 7), ("MIG-e-1g-b", 9201, 1, 8), ("MIG-e-3g", 9201, 4, 2)]


def test_an_inventory_read_in_this_process_is_read_and_signed_for_the_clusters_name(world):
    """inventory_nodes() reads each node as its agent would: the report names the cluster (by name, as the agent's
    queue does) and the node, and is reconciled into that cluster's rows."""
    asked = []

    def read(cluster, node, *, api_url):
        asked.append((cluster, node, api_url))
        return _report(cluster, node, int(timezone.now().timestamp()), west(gpu(0, "GPU-7f00-west-a")))

    with mock.patch.object(inv.agent, "read_inventory", side_effect=read):
        result = inv.inventory_nodes(world.west.pk, ["w-gpu-01"], api_url="https://west.example:6443")

    assert asked == [("west", "w-gpu-01", "https://west.example:6443")]
    assert (result.nodes, result.gpus) == (1, 1)
