"""The core data model: catalog loaded by migration, constraints hold in the database."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from capacity.mig.catalog import PRODUCTS
from capacity.models import Cluster, GpuCapacity, MigInstance, MigPlacement, MigProfile, NodeCapacity

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu():
    cluster = Cluster.objects.create(name="c1", kubeconfig_path="/tmp/kubeconfig")
    node = NodeCapacity.objects.create(cluster=cluster, name="n1", gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=8)
    return GpuCapacity.objects.create(
        node=node,
        index=0,
        uuid="GPU-1",
        product="NVIDIA H100 80GB HBM3",
        catalog_product="H100-80GB",
        mig_mode_current=True,
    )


def test_catalog_loaded_for_every_product():
    assert set(MigProfile.objects.values_list("product", flat=True)) == set(PRODUCTS)
    assert MigProfile.objects.count() == sum(len(p.profiles) for p in PRODUCTS.values())
    three = MigProfile.objects.get(product="H100-80GB", name="3g.40gb")
    assert (three.profile_id, three.compute_slices, three.memory_slices, three.placements) == (9, 3, 4, [0, 4])
    assert list(three.valid_placements.values_list("start", "size")) == [(0, 4), (4, 4)]


def test_duplicate_gpu_uuid_rejected(gpu):
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuCapacity.objects.create(node=gpu.node, index=1, uuid="GPU-1", product="NVIDIA H100 80GB HBM3")


def test_mig_instance_outside_catalog_placements_rejected(gpu):
    three = MigProfile.objects.get(product="H100-80GB", name="3g.40gb")
    # There is no catalog placement 3g.40gb @2: nothing to point at.
    assert not MigPlacement.objects.filter(profile=three, start=2).exists()
    # A start that disagrees with its catalog placement is refused by clean().
    bad = MigInstance(
        gpu=gpu,
        profile=three,
        placement=three.valid_placements.get(start=0),
        placement_start=2,
        placement_size=4,
        uuid="MIG-x",
    )
    with pytest.raises(ValidationError, match="catalog placement"):
        bad.full_clean()
    # A placement of another profile is refused.
    one = MigProfile.objects.get(product="H100-80GB", name="1g.10gb")
    other = MigInstance(
        gpu=gpu,
        profile=three,
        placement=one.valid_placements.get(start=0),
        placement_start=0,
        placement_size=1,
        uuid="MIG-y",
    )
    with pytest.raises(ValidationError, match="another profile"):
        other.full_clean()


def test_overlapping_mig_instances_rejected(gpu):
    four = MigProfile.objects.get(product="H100-80GB", name="4g.40gb")
    one = MigProfile.objects.get(product="H100-80GB", name="1g.10gb")
    MigInstance.objects.create(
        gpu=gpu,
        profile=four,
        placement=four.valid_placements.get(start=0),
        placement_start=0,
        placement_size=4,
        uuid="MIG-a",
    )
    clash = MigInstance(
        gpu=gpu,
        profile=one,
        placement=one.valid_placements.get(start=2),
        placement_start=2,
        placement_size=1,
        uuid="MIG-b",
    )
    with pytest.raises(ValidationError, match="Overlaps 4g.40gb"):
        clash.full_clean()
    # Two active instances at one start are refused by the database itself.
    with pytest.raises(IntegrityError), transaction.atomic():
        MigInstance.objects.create(
            gpu=gpu,
            profile=one,
            placement=one.valid_placements.get(start=0),
            placement_start=0,
            placement_size=1,
            uuid="MIG-c",
        )


def test_node_name_unique_per_cluster(gpu):
    with pytest.raises(IntegrityError), transaction.atomic():
        NodeCapacity.objects.create(cluster=gpu.node.cluster, name="n1")


def test_cluster_credentials_are_encrypted():
    cluster = Cluster(name="secret")
    cluster.set_kubeconfig("apiVersion: v1\nusers: [{name: u, user: {token: s3cr3t}}]")
    cluster.save()
    stored = Cluster.objects.values_list("encrypted_kubeconfig", flat=True).get(pk=cluster.pk)
    assert "s3cr3t" not in stored
    assert "s3cr3t" in Cluster.objects.get(pk=cluster.pk).kubeconfig_text()
