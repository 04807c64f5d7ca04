"""Project roles through guardian groups; visibility is one subquery."""

import pytest

from tenancy.roles import has_project_perm, projects_for, role_of, set_role

pytestmark = pytest.mark.django_db


def test_roles_grant_their_permissions(project, alice, bob, victor, charlie, operator):
    assert role_of(project, alice) == "admin"
    assert has_project_perm(alice, project, "manage_members")
    assert has_project_perm(bob, project, "request_capacity")
    assert not has_project_perm(bob, project, "manage_members")
    assert has_project_perm(victor, project, "view_project")
    assert not has_project_perm(victor, project, "request_capacity")
    assert list(projects_for(charlie)) != [project]
    assert project in projects_for(operator)


def test_set_role_replaces_and_removes(project, bob):
    set_role(project, bob, "viewer")
    assert role_of(project, bob) == "viewer"
    assert not has_project_perm(bob, project, "request_capacity")
    set_role(project, bob, None)
    assert role_of(project, bob) is None
    assert not projects_for(bob).exists()


def test_projects_for_is_one_query(project, other_project, bob, django_assert_num_queries):
    with django_assert_num_queries(1):
        assert list(projects_for(bob)) == [project]
