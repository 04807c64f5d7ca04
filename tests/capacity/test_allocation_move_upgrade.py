"""Upgrading a database from before Allocation moved to capacity: rows, content type and permissions stay.

capacity.0026 takes the model from pools without touching its table (`pools_allocation`); the content type
moves with it (app_label pools -> capacity), so a group given `view_allocation` before the upgrade still has
it, now as `capacity.view_allocation`, and the foreign keys of billing, monitoring and pools still reach the
same rows. Migrating back restores the old label.
"""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from capacity.models import Allocation, Cluster, GpuCapacity, NodeCapacity
from pools.models import GpuPool, PoolRequest
from tenancy.models import Project

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BEFORE = [
    ("capacity", "0025_mps_client_limits"),
    ("pools", "0021_share_priority_and_spec_kind_mps"),
    ("billing", "0014_spec_kind_mps"),
    ("monitoring", "0010_shareviolation_share_priority"),
]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    state = executor.migrate(targets)
    ContentType.objects.clear_cache()
    return state.apps


def _one_allocation() -> Allocation:
    project = Project.objects.create(name="Alpha", slug="alpha", namespace="alpha")
    cluster = Cluster.objects.create(name="c1", kubeconfig_path="/dev/null")
    node = NodeCapacity.objects.create(cluster=cluster, name="n1", gpu_count=1)
    gpu = GpuCapacity.objects.create(node=node, index=0, uuid="GPU-move", catalog_product="H100-80GB")
    request = PoolRequest.objects.create(project=project, spec_kind="full", product="H100-80GB")
    pool = GpuPool.objects.create(project=project, request=request, cluster=cluster, name="p1")
    return Allocation.objects.create(
        pool=pool, project=project, kind="full", gpu=gpu, resource_name="nvidia.com/gpu", product="H100-80GB"
    )


def test_an_operator_group_keeps_view_allocation_and_the_rows_stay_across_the_move():
    allocation = _one_allocation()
    content_type = ContentType.objects.get_for_model(Allocation)
    assert content_type.app_label == "capacity"
    permission = Permission.objects.get(content_type=content_type, codename="view_allocation")
    group = Group.objects.create(name="auditors")
    group.permissions.add(permission)
    user = get_user_model().objects.create(username="auditor", is_staff=True)
    user.groups.add(group)

    old = migrate(BEFORE)
    old_types = old.get_model("contenttypes", "ContentType").objects
    assert old_types.get(pk=content_type.pk).app_label == "pools"
    assert not old_types.filter(app_label="capacity", model="allocation").exists()
    assert old.get_model("pools", "Allocation").objects.get(pk=allocation.pk).gpu_id == allocation.gpu_id

    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    assert ContentType.objects.get_for_model(Allocation).pk == content_type.pk
    assert ContentType.objects.get(pk=content_type.pk).app_label == "capacity"
    assert Permission.objects.get(pk=permission.pk).content_type_id == content_type.pk
    user = get_user_model().objects.get(pk=user.pk)  # a fresh permission cache
    assert user.has_perm("capacity.view_allocation")
    assert not user.has_perm("pools.view_allocation")
    assert Allocation.objects.get(pk=allocation.pk).pool.project.slug == "alpha"
    assert list(GpuPool.objects.get(pk=allocation.pool_id).allocations.values_list("pk", flat=True)) == [allocation.pk]
