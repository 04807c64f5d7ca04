"""Tenancy, the bottom layer: projects, their members' object permissions and personal API tokens.

Visibility: guardian object permissions live on Project only (direct foreign-key tables); every
child object of any app is scoped through `project__in=<projects the user may view>` in one query
(tenancy.roles). The tables keep their historical `pools_` names: the models moved here from pools
without touching the database (tenancy/migrations/0001_initial.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone
from guardian.models import GroupObjectPermissionBase, UserObjectPermissionBase

from .choices import Role

dns_label = RegexValidator(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "Lower-case letters, digits and '-' (a DNS label).")


class Project(models.Model):
    """A team that requests and holds GPU capacity; maps to one Kubernetes namespace per cluster."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=63, unique=True)
    namespace = models.CharField(max_length=63, unique=True, validators=[dns_label])
    cost_centre = models.CharField(max_length=64, blank=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "pools_project"
        ordering = ["slug"]
        permissions = [
            ("manage_members", "Can manage project members"),
            ("request_capacity", "Can request GPU capacity"),
        ]

    def __str__(self) -> str:
        return self.name


class ProjectUserObjectPermission(UserObjectPermissionBase):
    content_object = models.ForeignKey(Project, on_delete=models.CASCADE)

    class Meta(UserObjectPermissionBase.Meta):
        db_table = "pools_projectuserobjectpermission"


class ProjectGroupObjectPermission(GroupObjectPermissionBase):
    content_object = models.ForeignKey(Project, on_delete=models.CASCADE)

    class Meta(GroupObjectPermissionBase.Meta):
        db_table = "pools_projectgroupobjectpermission"


class ApiTokenQuerySet(models.QuerySet):
    def usable(self):
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))


class ApiToken(models.Model):
    """A personal API token. Only a SHA-256 digest is stored; the key is shown once at creation."""

    PREFIX = "gpa_"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    key_prefix = models.CharField(max_length=12, help_text="First characters of the key, to recognise it.")
    key_digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        help_text="The token the creating request authenticated with; revoking it revokes this one.",
    )

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        db_table = "pools_apitoken"
        ordering = ["user_id", "-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_prefix}…)"

    @staticmethod
    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    @staticmethod
    def latest_expiry(*, parent: ApiToken | None = None, now=None):
        """The latest expiry a new token may have: API_TOKEN_MAX_LIFETIME_DAYS from now, and never after
        `parent`, the token the creating request authenticated with. None: no limit at all."""
        now = now or timezone.now()
        days = settings.API_TOKEN_MAX_LIFETIME_DAYS
        limits = [now + dt.timedelta(days=days)] if days else []
        if parent is not None and parent.expires_at is not None:
            limits.append(parent.expires_at)
        return min(limits, default=None)

    @classmethod
    def issue(cls, user, name: str, expires_at=None, *, parent: ApiToken | None = None) -> tuple[ApiToken, str]:
        """Create a token; returns (token, plain key). The plain key is not kept anywhere.

        No `expires_at`: the latest allowed (latest_expiry). A later one raises ValueError; callers
        taking input check it first for a friendly message (ApiTokenSerializer, issue_token).
        """
        limit = cls.latest_expiry(parent=parent)
        if expires_at is None:
            expires_at = limit
        elif limit is not None and expires_at > limit:
            raise ValueError(f"a token may not expire after {limit.isoformat()}")
        key = cls.PREFIX + secrets.token_urlsafe(32)
        with transaction.atomic():
            # The parent's row lock orders this against revoke_token(), which locks every row it
            # revokes: a child is either seen and revoked with its parent, or refused here.
            if (
                parent is not None
                and not cls.objects.select_for_update().filter(pk=parent.pk, revoked_at=None).exists()
            ):
                raise ValueError("the token making this request was revoked")
            token = cls.objects.create(
                user=user,
                name=name,
                key_prefix=key[:10],
                key_digest=cls.digest(key),
                expires_at=expires_at,
                parent=parent,
            )
        return token, key

    def descendant_ids(self, *, lock: bool = False) -> list[int]:
        """Every token minted with this one, with a token minted with one of those, and so on.

        `lock` (inside a transaction): each level's rows are locked as they are read, so a token
        being minted with one of them concurrently is either found by the next level or waits.
        """
        found, frontier = [], [self.pk]
        while frontier:
            level = ApiToken.objects.filter(parent_id__in=frontier).order_by("pk")
            frontier = list((level.select_for_update() if lock else level).values_list("pk", flat=True))
            found += frontier
        return found

    @property
    def is_usable(self) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())


class IdentityGroupRoleQuerySet(models.QuerySet):
    def for_groups(self, groups) -> IdentityGroupRoleQuerySet:
        return self.filter(group__in=list(groups))


class IdentityGroupRole(models.Model):
    """What one identity-provider group gives in gpuaas: operator, or a role on one project.

    Read at every OIDC sign-in and bearer-token check (tenancy.roles.apply_identity_groups); editable
    by operators in the admin, so mapping a new team needs no deployment. A group may have several
    rows (operator and a project role, or roles on several projects).
    """

    group = models.CharField(max_length=255, help_text="The group's name as the provider sends it in the groups claim.")
    operator = models.BooleanField(default=False, help_text="Members of the group are operators (staff, Operators).")
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, related_name="group_roles")
    role = models.CharField(max_length=16, blank=True, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = IdentityGroupRoleQuerySet.as_manager()

    class Meta:
        ordering = ["group", "pk"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(operator=True, project__isnull=True, role="")
                    | Q(operator=False, project__isnull=False) & ~Q(role="")
                ),
                name="%(app_label)s_%(class)s_operator_or_project_role",
                violation_error_message="Either operator, or a project with a role.",
            ),
            models.UniqueConstraint(
                fields=["group"], condition=Q(operator=True), name="%(app_label)s_%(class)s_unique_operator_group"
            ),
            models.UniqueConstraint(fields=["group", "project"], name="%(app_label)s_%(class)s_unique_group_project"),
        ]
        indexes = [models.Index(fields=["group"], name="tenancy_identitygroup_group")]

    def __str__(self) -> str:
        return f"{self.group} → operator" if self.operator else f"{self.group} → {self.role} on {self.project}"

    def clean(self):
        from django.core.exceptions import ValidationError

        if self.operator and (self.project_id or self.role):
            raise ValidationError({"project": "An operator mapping names no project or role: make two rows."})
        if not self.operator:
            errors = {}
            if not self.project_id:
                errors["project"] = "Choose the project this group gives a role on (or tick operator)."
            if not self.role:
                errors["role"] = "Choose the role this group gives on the project."
            if errors:
                raise ValidationError(errors)


class ExternalIdentity(models.Model):
    """The link between a gpuaas user and the identity provider's subject (`iss` + `sub`).

    Users are found by this link at sign-in, never by username or e-mail, so a provider account can
    never take over a local one that happens to share its name.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identity")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    groups = models.JSONField(default=list, blank=True, help_text="The groups claim at the last check.")
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["issuer", "subject"]
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="%(app_label)s_%(class)s_unique_subject")
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.subject} at {self.issuer})"
