"""The group-to-role mapping (tenancy.IdentityGroupRole) and its application at each check."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from tenancy import roles
from tenancy.models import IdentityGroupRole

pytestmark = pytest.mark.django_db


@pytest.fixture
def person(django_user_model):
    return django_user_model.objects.create_user("pat")


def test_the_highest_role_wins_and_leaving_one_group_leaves_the_other_role(person, project):
    IdentityGroupRole.objects.create(group="readers", project=project, role="viewer")
    IdentityGroupRole.objects.create(group="leads", project=project, role="admin")
    assert roles.apply_identity_groups(person, ["readers", "leads"])
    assert roles.role_of(project, person) == "admin"
    assert roles.apply_identity_groups(person, ["readers"])
    assert roles.role_of(project, person) == "viewer"
    assert not roles.apply_identity_groups(person, [])
    assert roles.role_of(project, person) is None and not person.groups.exists()


def test_operator_is_given_and_taken_with_its_group(person, project):
    IdentityGroupRole.objects.create(group="ops", operator=True)
    roles.apply_identity_groups(person, ["ops"])
    person.refresh_from_db()
    assert person.is_staff and roles.operator_can(person, "tenancy.view_project")
    roles.apply_identity_groups(person, ["someone-else"])
    person.refresh_from_db()
    assert not person.is_staff and not person.groups.filter(name=roles.OPERATORS_GROUP).exists()


def test_a_role_given_by_hand_is_replaced_by_the_mapping(person, project, other_project):
    roles.set_role(other_project, person, "admin")
    IdentityGroupRole.objects.create(group="team-a", project=project, role="member")
    roles.apply_identity_groups(person, ["team-a"])
    assert (roles.role_of(project, person), roles.role_of(other_project, person)) == ("member", None)


def test_nothing_is_written_when_nothing_changed(person, project):
    IdentityGroupRole.objects.create(group="team-a", project=project, role="member")
    roles.apply_identity_groups(person, ["team-a"])
    with CaptureQueriesContext(connection) as queries:
        roles.apply_identity_groups(person, ["team-a"])
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    assert statements.count("SELECT") == 3  # mappings, held roles, Operators membership
    assert not {"INSERT", "UPDATE", "DELETE"} & set(statements)


def test_a_mapping_is_operator_or_a_project_role_never_both(project):
    with pytest.raises(ValidationError) as both:
        IdentityGroupRole(group="g", operator=True, project=project, role="member").full_clean()
    assert "project" in both.value.message_dict
    with pytest.raises(ValidationError) as neither:
        IdentityGroupRole(group="g").full_clean()
    assert set(neither.value.message_dict) >= {"project", "role"}
    with pytest.raises(IntegrityError), transaction.atomic():
        IdentityGroupRole.objects.create(group="g", operator=True, project=project, role="member")
