"""Upgrading a database from before tenancy existed: members keep their object permissions.

The models moved from pools to tenancy without touching the tables; the content types move with
them (tenancy.0001), so the Permission rows that guardian's object permissions point at now belong
to tenancy.Project.
"""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from guardian.core import ObjectPermissionChecker

from tenancy import roles
from tenancy.choices import Role
from tenancy.models import Project

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    state = executor.migrate(targets)
    ContentType.objects.clear_cache()
    return state.apps


def test_a_member_keeps_the_object_permission_across_the_move():
    old = migrate([("tenancy", None)])  # pools.0004: Project still in pools
    content_type = old.get_model("contenttypes", "ContentType").objects.get(app_label="pools", model="project")
    assert not old.get_model("contenttypes", "ContentType").objects.filter(app_label="tenancy").exists()
    permission = old.get_model("auth", "Permission").objects.get(content_type=content_type, codename="view_project")
    user = old.get_model("auth", "User").objects.create(username="bob")
    group = old.get_model("auth", "Group").objects.create(name="project:alpha:member")
    group.user_set.add(user)
    project = old.get_model("pools", "Project").objects.create(name="Alpha", slug="alpha", namespace="alpha")
    old.get_model("pools", "ProjectGroupObjectPermission").objects.create(
        group=group, permission=permission, content_object=project
    )

    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    project = Project.objects.get(slug="alpha")
    bob = get_user_model().objects.get(username="bob")
    assert ContentType.objects.get_for_model(Project).pk == content_type.pk
    assert roles.role_of(project, bob) == Role.MEMBER
    assert roles.has_project_perm(bob, project, "view_project")
    assert ObjectPermissionChecker(bob).has_perm("tenancy.view_project", project)
    assert list(roles.projects_for(bob)) == [project]
