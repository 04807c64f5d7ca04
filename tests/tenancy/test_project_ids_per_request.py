"""tenancy.roles.project_ids_of: a member's project ids are read once per request, and afresh in the next one.

roles.request_began/request_ended are what Django's request_started/request_finished signals call; sent here
directly because sending request_started itself would also close the test's database connection.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from pools.models import PoolRequest
from tenancy import roles
from tenancy.choices import Role

pytestmark = pytest.mark.django_db


def test_one_request_reads_the_ids_once_per_perm(bob, project, django_assert_num_queries):
    roles.request_began()
    try:
        with django_assert_num_queries(1):
            assert roles.project_ids_of(bob) == [project.pk]
            assert roles.project_ids_of(bob) == [project.pk]
            PoolRequest.objects.filter(roles.in_projects_of(bob)).query  # noqa: B018 (built, not run)
        with django_assert_num_queries(1):  # another perm is another read
            assert roles.project_ids_of(bob, "manage_members") == []
            assert roles.project_ids_of(bob, "manage_members") == []
    finally:
        roles.request_ended()


def test_the_next_request_reads_again_even_with_the_same_user_object(bob, project, django_assert_num_queries):
    roles.request_began()
    assert roles.project_ids_of(bob) == [project.pk]
    roles.request_ended()
    roles.set_role(project, bob, None)
    roles.request_began()
    try:
        with django_assert_num_queries(1):
            assert roles.project_ids_of(bob) == []
    finally:
        roles.request_ended()


def test_outside_a_request_nothing_is_kept(bob, project, django_assert_num_queries):
    with django_assert_num_queries(2):
        assert roles.project_ids_of(bob) == [project.pk]
        assert roles.project_ids_of(bob) == [project.pk]


def test_a_removed_role_takes_effect_on_the_next_api_request(bob, project):
    """force_authenticate hands the same user object to every request: the ids must not stick to it."""
    PoolRequest.objects.create(project=project, product="H100-80GB", count=1)
    client = APIClient()
    client.force_authenticate(bob)
    assert client.get("/api/v1/pool-requests/").json()["count"] == 1
    roles.set_role(project, bob, None)
    assert client.get("/api/v1/pool-requests/").json()["count"] == 0
    roles.set_role(project, bob, Role.MEMBER)
    assert client.get("/api/v1/pool-requests/").json()["count"] == 1


def test_an_outsider_and_an_anonymous_user_match_nothing(charlie, project):
    from django.contrib.auth.models import AnonymousUser

    PoolRequest.objects.create(project=project, product="H100-80GB", count=1)
    assert not PoolRequest.objects.filter(roles.in_projects_of(charlie)).exists()
    assert roles.project_ids_of(AnonymousUser()) == []
    assert not PoolRequest.objects.filter(roles.in_projects_of(AnonymousUser())).exists()
    assert PoolRequest.objects.exclude(roles.in_projects_of(AnonymousUser())).count() == 1
