"""Project roles on guardian: one group per (project, role), object permissions on Project only.

Children (pools, requests, allocations, usage, statements, metrics) are never given permissions of
their own: they are scoped with `project__in=projects_for(user)`, one subquery, however many rows.
"""

from __future__ import annotations

from contextvars import ContextVar

from django.contrib.auth.models import Group
from django.core.signals import request_finished, request_started
from django.db import transaction
from django.db.models import F, Lookup, QuerySet
from guardian.shortcuts import assign_perm

from .choices import Role
from .models import IdentityGroupRole, Project, ProjectGroupObjectPermission, ProjectUserObjectPermission

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
            assign_perm(f"tenancy.{codename}", group, project)
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


# --- Operators: active staff, each action gated by the Django model permission it needs ------------

OPERATORS_GROUP = "Operators"
# Every permission of these apps goes to the Operators group (models added later included: rerun
# `manage.py operators_group`). Users and groups (auth) stay with superusers.
OPERATOR_APPS = (
    "tenancy",
    "policies",
    "pools",
    "capacity",
    "pricing",
    "operations",
    "billing",
    "monitoring",
    "notifications",
)


def is_operator(user) -> bool:
    """An active staff account: may use the admin. What it may *do* there is operator_can()'s question."""
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def operator_can(user, *perms: str) -> bool:
    """Active staff holding every one of the global model permissions `perms` ("app.codename").

    Superusers hold everything. Object permissions (guardian, on Project) do not count here: an
    operator action is fleet-wide, so it needs the model-level permission (ModelBackend caches them
    on the user object, so repeated checks in one request cost one query).
    """
    if not is_operator(user):
        return False
    if user.is_superuser:
        return True
    from django.contrib.auth.backends import ModelBackend

    backend = ModelBackend()
    return all(backend.has_perm(user, perm) for perm in perms)


def sees_all_projects(user) -> bool:
    """Operators holding pools.view_project read every project's objects; other staff see their own."""
    return operator_can(user, "tenancy.view_project")


def require_operator_perms(user, *perms: str) -> None:
    """Django's PermissionDenied (the admin's 403 page) unless operator_can(user, *perms)."""
    from django.core.exceptions import PermissionDenied

    if not operator_can(user, *perms):
        raise PermissionDenied(f"Needs the permission(s) {', '.join(perms)} (the {OPERATORS_GROUP} group has them).")


def operator_required(*perms: str):
    """Decorator for plain views and admin pages: require_operator_perms(request.user, *perms) first."""
    from functools import wraps

    def decorate(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            require_operator_perms(request.user, *perms)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


@transaction.atomic
def operators_group() -> Group:
    """The Operators group, holding every permission of OPERATOR_APPS. Idempotent; returns the group.

    Making someone an operator is then: is_staff=True and member of this group.
    """
    from django.apps import apps
    from django.contrib.auth.management import create_permissions
    from django.contrib.auth.models import Permission

    for app_label in OPERATOR_APPS:  # permissions are created after migrate; make sure they exist
        create_permissions(apps.get_app_config(app_label), verbosity=0)
    group, _ = Group.objects.get_or_create(name=OPERATORS_GROUP)
    group.permissions.add(*Permission.objects.filter(content_type__app_label__in=OPERATOR_APPS))
    return group


def projects_for(user, perm: str = "view_project") -> QuerySet[Project]:
    """Projects on which `user` holds `perm` (a codename of tenancy.Project), as one SQL subquery."""
    ids = project_ids_for(user, perm)
    return Project.objects.all() if ids is None else Project.objects.filter(pk__in=ids)


def has_project_perm(user, project: Project, perm: str) -> bool:
    return projects_for(user, perm).filter(pk=project.pk).exists()


# --- Added with the self-service API (issue: projects and GPU pools) -----------------------------

ROLE_BY_PERMISSION = (("manage_members", Role.ADMIN), ("request_capacity", Role.MEMBER), ("view_project", Role.VIEWER))


def annotate_roles(queryset: QuerySet[Project], user) -> QuerySet[Project]:
    """Annotate `perm_<codename>` booleans for `user` on each project, in the same query (EXISTS per flag)."""
    from django.db.models import Exists, OuterRef, Value

    if not (user and user.is_authenticated):
        return queryset.annotate(**{f"perm_{c}": Value(False) for c, _ in ROLE_BY_PERMISSION})
    flags = {}
    for codename, _ in ROLE_BY_PERMISSION:
        by_group = ProjectGroupObjectPermission.objects.filter(
            content_object=OuterRef("pk"), group__user=user, permission__codename=codename
        )
        by_user = ProjectUserObjectPermission.objects.filter(
            content_object=OuterRef("pk"), user=user, permission__codename=codename
        )
        flags[f"perm_{codename}"] = Exists(by_group) | Exists(by_user)
    return queryset.annotate(**flags)


def role_from_annotations(project: Project) -> str | None:
    """The role implied by annotate_roles() flags: admin, member, viewer or None."""
    for codename, role in ROLE_BY_PERMISSION:
        if getattr(project, f"perm_{codename}", False):
            return role
    return None


def admins_left(project: Project, *, without) -> int:
    """How many admins `project` keeps if `without` stops being one."""
    from django.contrib.auth import get_user_model

    users = get_user_model().objects.filter(groups__name=group_name(project, Role.ADMIN), is_active=True)
    return users.exclude(pk=without.pk).count()


def project_ids_for(user, perm: str = "view_project") -> QuerySet:
    """Ids of the projects on which `user` holds `perm`, as one UNION subquery; None when all (operators).

    The same set as projects_for(), shaped for `project_id__in=`: PostgreSQL estimates a UNION of
    the two permission lookups well (it returns the user's handful of projects), whereas the OR of
    two IN-subqueries in projects_for() is estimated at three quarters of all projects, which turns
    a 100-row lookup into whole-table hash joins once there are thousands of projects (bench api).
    """
    if operator_can(user, "tenancy.view_project", f"tenancy.{perm}"):
        return None
    if not (user and user.is_authenticated and user.is_active):
        return Project.objects.none().values("pk")
    # The user's groups straight from the membership table: joining auth_group adds nothing but cost.
    groups = user.groups.through.objects.filter(user=user).values("group_id")
    by_group = ProjectGroupObjectPermission.objects.filter(group_id__in=groups, permission__codename=perm)
    by_user = ProjectUserObjectPermission.objects.filter(user=user, permission__codename=perm)
    return by_group.values("content_object_id").union(by_user.values("content_object_id"))


# --- Company sign-in: the identity provider's groups decide (docs/security.md "Company sign-in") ----

ROLE_RANK = {Role.VIEWER: 1, Role.MEMBER: 2, Role.ADMIN: 3}


@transaction.atomic
def apply_identity_groups(user, groups) -> bool:
    """Make `user`'s operator status and project roles exactly what `groups` map to; True if any remain.

    The mapping is tenancy.IdentityGroupRole (operators edit it in the admin). A user signed in
    through the identity provider holds nothing the provider does not give: a role on a project
    whose group they left is removed, and so is operator (is_staff and the Operators group) when no
    operator group is left. On a project given by several groups the highest role wins. Superuser is
    never given or taken here: it stays a local, break-glass account's flag. Idempotent, and writes
    nothing when nothing changed (it runs at every sign-in and bearer-token check).
    """
    mappings = list(IdentityGroupRole.objects.for_groups(groups).select_related("project"))
    operator = any(m.operator for m in mappings)
    wanted: dict[str, tuple[Project, str]] = {}
    for m in mappings:
        if m.project_id and ROLE_RANK[m.role] > ROLE_RANK.get(wanted.get(m.project.slug, (None, ""))[1], 0):
            wanted[m.project.slug] = (m.project, m.role)
    held: dict[str, str] = {}
    for name in user.groups.filter(name__startswith="project:").values_list("name", flat=True):
        _, slug, role = name.split(":", 2)
        if ROLE_RANK.get(role, 0) > ROLE_RANK.get(held.get(slug, ""), 0):
            held[slug] = role
    for slug in sorted(set(held) - set(wanted)):
        project = Project.objects.filter(slug=slug).first()
        if project is not None:
            set_role(project, user, None)
    for slug, (project, role) in sorted(wanted.items()):
        if held.get(slug) != role:
            set_role(project, user, role)
    in_operators = user.groups.filter(name=OPERATORS_GROUP).exists()
    if operator and not in_operators:
        operators_group().user_set.add(user)
    elif not operator and in_operators:
        user.groups.remove(Group.objects.get(name=OPERATORS_GROUP))
    if user.is_staff != operator:
        user.is_staff = operator
        user.save(update_fields=["is_staff"])
    return operator or bool(wanted)


def mapped_groups_exist(groups) -> bool:
    """Whether any of `groups` is mapped to something (a newcomer with none gets no account)."""
    return IdentityGroupRole.objects.for_groups(groups).exists()


class InProjectIds(Lookup):
    """`column IN (the user's project ids)`, the ids as literals: on PostgreSQL `column = ANY(%s)`, one array.

    The ids are read first (project_ids_of: one short query, once per request) rather than inlined as a
    subquery. With a subquery, even as `= ANY(ARRAY(subquery))` (an InitPlan), PostgreSQL cannot see how
    many ids there are: it assumes a fixed fraction of the table and, for a list ordered by creation,
    walks the whole `created_at DESC` index filtering rows, which is slowest exactly for members of old
    projects (issue 28: a member's page of 50 pool requests took seconds at a million requests). With the
    ids as an array of constants it estimates from the column statistics, starts from an index scan of
    those projects' rows and sorts the few hundred it finds (tests/foundation/test_member_list_plans.py
    pins those plans). An empty list matches nothing.
    """

    lookup_name = "in_project_ids"  # used directly (in_projects_of), never registered on a field
    prepare_rhs = False

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        if not self.rhs:
            return "1 = 0", ()
        return f"{lhs} IN ({', '.join(['%s'] * len(self.rhs))})", (*lhs_params, *self.rhs)

    def as_postgresql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s)", (*lhs_params, list(self.rhs))


_REQUEST: ContextVar[object | None] = ContextVar("gpuaas_request", default=None)


def request_began(**kwargs) -> None:
    _REQUEST.set(object())


def request_ended(**kwargs) -> None:
    _REQUEST.set(None)


request_started.connect(request_began, dispatch_uid="tenancy.roles.request_started")
request_finished.connect(request_ended, dispatch_uid="tenancy.roles.request_finished")


def project_ids_of(user, perm: str = "view_project") -> list[int] | None:
    """project_ids_for(user, perm) read into a sorted list; None for operators who see every project.

    Inside a request the list is kept on the user object, per perm, so every list and subquery of the
    request reads it once. It is stamped with the request it was read in (a token set at Django's
    request_started signal, cleared at request_finished): a user object reused by a later request (the
    test client's force_authenticate does that) reads again, so a role removed takes effect on the next
    request. Outside a request (tasks, commands, shells) nothing is kept: each call reads.
    """
    request = _REQUEST.get()
    cache = getattr(user, "_project_ids_cache", None) if request is not None else None
    if cache is not None and cache[0] is request and perm in cache[1]:
        return cache[1][perm]
    ids = project_ids_for(user, perm)
    if ids is not None:
        signed_in = user is not None and user.is_authenticated and user.is_active
        ids = sorted(row["content_object_id"] for row in ids) if signed_in else []
    if request is not None and user is not None and user.is_authenticated:
        if cache is None or cache[0] is not request:
            cache = (request, {})
            user._project_ids_cache = cache
        cache[1][perm] = ids
    return ids


def in_projects_of(user, column: str = "project_id", perm: str = "view_project") -> InProjectIds | None:
    """The condition "`column` is one of the projects on which `user` holds `perm`"; None for operators.

    `column` is a path to a project id (`project_id`, `allocation__project_id`). For scoping big tables:
    `queryset.filter(condition)`, or inside Q(...) | Q(...). The ids come from project_ids_of (read once
    per request, then literals in the SQL).
    """
    ids = project_ids_of(user, perm)
    return None if ids is None else InProjectIds(F(column), ids)
