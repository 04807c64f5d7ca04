"""Tier placement owned by gpuaas: which tier a node serves, and which MIG profiles each tier carries."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Exists, F, OuterRef, Q

from ..choices import Tier


@dataclass(frozen=True)
class Policy:
    """The MIG profiles a tier carries, by compute slices: min..max."""

    min_compute_slices: int = 1
    max_compute_slices: int = 8

    def allows(self, compute_slices: int) -> bool:
        return self.min_compute_slices <= compute_slices <= self.max_compute_slices

    @property
    def admits_all(self) -> bool:
        return self.min_compute_slices <= 1 and self.max_compute_slices >= 8

    def label(self) -> str:
        """What the tier admits, as every screen says it: "3g and larger", "only 1g/2g", "every profile"."""
        if self.admits_all:
            return "every profile"
        if self.max_compute_slices >= 8:
            return f"{self.min_compute_slices}g and larger"
        sizes = "/".join(f"{n}g" for n in range(self.min_compute_slices, self.max_compute_slices + 1))
        return f"only {sizes}"


# The seed's recommendation. Migration 0020 wrote it as one TierProfilePolicy row per tier (the rows are
# what approval reads, and what the admin edits); it stands in only for a tier whose row was deleted.
DEFAULT_POLICIES: dict[str, Policy] = {
    Tier.SLA_INFERENCE: Policy(min_compute_slices=3),
    Tier.STAGING: Policy(),
    Tier.DEVELOPMENT: Policy(max_compute_slices=2),
    Tier.TRAINING: Policy(),
    Tier.NONE: Policy(),
}
BUILT_IN_NOTE = "Built-in default (the seed's recommendation); edit to change what approval gives out on this tier."


class TierProfilePolicyQuerySet(models.QuerySet):
    def table(self) -> dict[str, Policy]:
        """Every tier's policy: its row, or the built-in default where the row is missing (one query)."""
        found = dict(DEFAULT_POLICIES)
        for tier, low, high in self.values_list("tier", "min_compute_slices", "max_compute_slices"):
            found[tier] = Policy(low, high)
        return found


class TierProfilePolicy(models.Model):
    """The MIG profiles a tier carries, by compute slices (tier 1: 3g and larger; development: 1g/2g).

    Every tier has a row (migration 0020 wrote the built-in defaults, DEFAULT_POLICIES, saying so in
    `notes`). A unit whose profile its node's tier does not admit is withheld: its availability is
    Availability.TIER_POLICY (capacity/models/availability.py), which approval, the dashboard, the
    form's check, the dry run and the forecast all read.
    """

    tier = models.CharField(max_length=8, choices=Tier, unique=True, blank=True)
    min_compute_slices = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(8)]
    )
    max_compute_slices = models.PositiveSmallIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(8)]
    )
    notes = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TierProfilePolicyQuerySet.as_manager()

    class Meta:
        ordering = ["tier"]
        verbose_name_plural = "tier profile policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(min_compute_slices__lte=F("max_compute_slices")),
                name="capacity_tierprofilepolicy_min_le_max",
            ),
        ]

    def __str__(self) -> str:
        return f"tier {self.tier or '(none)'}: {self.policy.label()}"

    @property
    def policy(self) -> Policy:
        return Policy(self.min_compute_slices, self.max_compute_slices)

    def clean(self) -> None:
        if self.min_compute_slices and self.max_compute_slices and self.min_compute_slices > self.max_compute_slices:
            raise ValidationError({"max_compute_slices": "The largest profile must be at least the smallest."})


def admitted_q(gpu: str = "gpu__", table: dict[str, Policy] | None = None) -> Q:
    """MIG instances whose profile their node's tier admits, as one filter in SQL (`gpu`: path to the GPU).

    The node's TierProfilePolicy row decides; a tier without a row follows DEFAULT_POLICIES. Written as
    subqueries on the policy table, so every read of availability sees the rows without a query of its own.

    `table`: the rows as the caller read them (TierProfilePolicyQuerySet.table(), in the same request), written
    into the SQL as literals instead: the same rule, without a subquery per instance (PostgreSQL runs the
    correlated EXISTS once a row, which dominated the dashboard's counts over 180,000 instances).
    """
    if table is not None:
        refused = Q(pk__in=[])
        for tier, policy in sorted(table.items()):
            if not policy.admits_all:
                allowed = (policy.min_compute_slices, policy.max_compute_slices)
                refused |= Q(**{f"{gpu}node__tier": tier}) & ~Q(profile__compute_slices__range=allowed)
        return ~refused
    slices = OuterRef("profile__compute_slices")
    row = TierProfilePolicy.objects.filter(tier=OuterRef(f"{gpu}node__tier"))
    refused_by_row = Exists(row.filter(Q(min_compute_slices__gt=slices) | Q(max_compute_slices__lt=slices)))
    refused_by_default = Q(pk__in=[])
    for tier, policy in DEFAULT_POLICIES.items():
        if not policy.admits_all:
            refused_by_default |= Q(**{f"{gpu}node__tier": tier}) & ~Q(
                profile__compute_slices__range=(policy.min_compute_slices, policy.max_compute_slices)
            )
    return ~Q(refused_by_row) & ~(refused_by_default & ~Exists(row))


class TierAssignment(models.Model):
    """gpuaas owns this node's tier: it writes the `gpuaas.io/tier` label and puts it back when it drifts.

    Nodes without an assignment keep the tier their label says (read by discovery).
    """

    node = models.OneToOneField("capacity.NodeCapacity", on_delete=models.CASCADE, related_name="tier_assignment")
    tier = models.CharField(max_length=8, choices=Tier, blank=True, help_text="Empty: untiered (label removed).")
    assigned_at = models.DateTimeField(auto_now=True)
    assigned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    labelled_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the node's label was last seen or made right."
    )
    last_error = models.TextField(blank=True, editable=False)

    class Meta:
        ordering = ["node_id"]

    def __str__(self) -> str:
        return f"{self.node}: tier {self.tier or '(none)'}"
