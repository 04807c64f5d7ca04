"""Project roles on guardian: one group per (project, role), object permissions on Project only.

Children (pools, requests, allocations, usage, statements, metrics) are never given permissions of
their own: they are scoped with `project__in=projects_for(user)`, one subquery, however many rows.
"""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Q, QuerySet
from guardian.shortcuts import assign_perm

from .choices import Role
from .models import Project, ProjectGroupObjectPermission, ProjectUserObjectPermission

ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    Role.ADMIN: ("view_project", "change_project", "manage_members", "request_capacity"),
    Role.MEMBER: ("view_project", "request_capacity"),
    Role.VIEWER: ("view_project",),
}


def group_name(project: Project, role: str) -> str:
    return f"project:{project.slug}:{role}"


def role_group(project: Project, role: str) -> Group:
    """The group holding `role` on `project`, created with its object permissions on first use."""
    group, created = Group.objects.get_or_create(name=group_name(project, role))
    if created:
        for codename in ROLE_PERMISSIONS[role]:
            assign_perm(f"pools.{codename}", group, project)
    return group


@transaction.atomic
def set_role(project: Project, user, role: str | None) -> None:
    """Give `user` exactly one role on `project` (None removes them). Idempotent."""
    for existing in Role.values:
        group = Group.objects.filter(name=group_name(project, existing)).first()
        if group is not None and existing != role:
            group.user_set.remove(user)
    if role is not None:
        role_group(project, role).user_set.add(user)


def role_of(project: Project, user) -> str | None:
    names = set(user.groups.filter(name__startswith=f"project:{project.slug}:").values_list("name", flat=True))
    for role in (Role.ADMIN, Role.MEMBER, Role.VIEWER):
        if group_name(project, role) in names:
            return role
    return None


def members(project: Project) -> list[tuple[object, str]]:
    from django.contrib.auth import get_user_model

    result = []
    for role in (Role.ADMIN, Role.MEMBER, Role.VIEWER):
        users = get_user_model().objects.filter(groups__name=group_name(project, role)).order_by("username")
        result.extend((user, role) for user in users)
    return result


def is_operator(user) -> bool:
    """Operators are staff; they see every project."""
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def projects_for(user, perm: str = "view_project") -> QuerySet[Project]:
    """Projects on which `user` holds `perm` (a codename of pools.Project), as one SQL subquery."""
    if is_operator(user):
        return Project.objects.all()
    if not (user and user.is_authenticated and user.is_active):
        return Project.objects.none()
    by_group = ProjectGroupObjectPermission.objects.filter(group__user=user, permission__codename=perm).values(
        "content_object_id"
    )
    by_user = ProjectUserObjectPermission.objects.filter(user=user, permission__codename=perm).values(
        "content_object_id"
    )
    return Project.objects.filter(Q(pk__in=by_group) | Q(pk__in=by_user))


def has_project_perm(user, project: Project, perm: str) -> bool:
    return projects_for(user, perm).filter(pk=project.pk).exists()
