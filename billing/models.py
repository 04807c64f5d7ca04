"""Billing: hourly usage records, monthly statements and the runs that make them (rate cards are pricing's).

Money is Decimal everywhere. Usage records carry seconds and the hourly rate applied, never a
rounded amount: a statement line groups records by rate, so its amount is rate x summed seconds
/ 3600, exact, rounded once to cents (docs/billing.md, "Rounding"). A finalised statement never
changes: its save()/delete() refuse, and database triggers (billing/triggers.py, migration 0002)
refuse UPDATE/DELETE of it and INSERT/UPDATE/DELETE of its lines.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from capacity.choices import SpecKind
from core.api import DomainConflict
from pricing.models import RateCard, billing_currency
from pricing.rates import SpecKey, spec_key

from .choices import STATEMENT_AMOUNTS, LineType, RunKind, RunStatus, StatementState
from .periods import month_bounds

HOUR_S = 3600
CENTS = Decimal("0.01")


class StatementFinalised(DomainConflict):
    """A finalised statement (or one of its lines) was asked to change (the API answers 409)."""


class MonthNotEnded(ValueError):
    """A month that has not ended was asked to be finalised or closed: its usage is still being metered."""


class MeteringWatermark(models.Model):
    """Singleton: every hour before `metered_until` has been metered. Claimed hour by hour with a conditional UPDATE."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    metered_until = models.DateTimeField()
    measured_until = models.DateTimeField(
        null=True, blank=True, help_text="Hours before this had monitoring's final rollups applied (showback)."
    )
    updated_at = models.DateTimeField(auto_now=True)
    claimed_by = models.CharField(max_length=64, blank=True, help_text="The metering run holding the lease.")
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="A metering run's lease: billing.recovery.sweep() re-enqueues after it."
    )

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="billing_meteringwatermark_singleton")]

    def __str__(self) -> str:
        return f"metered until {self.metered_until:%Y-%m-%d %H:%M} UTC"


class UsageRecordQuerySet(models.QuerySet):
    def in_month(self, period: date):
        start, end = month_bounds(period)
        return self.filter(hour__gte=start, hour__lt=end)


class UsageRecord(models.Model):
    """One allocation's reserved use in one UTC hour, prorated to the second.

    Unique per (allocation, hour): a retried or concurrent metering run inserts nothing twice.
    Spec, project and pool are copied from the allocation so a statement is one GROUP BY.
    Showback fields are NULL when nothing was measured ("not measured", never zero).
    """

    # Indexes are few on purpose (every metered hour inserts one row per allocation into each):
    # (hour, allocation) unique, allocation, (project, hour), and a partial one for credited rows.
    allocation = models.ForeignKey("capacity.Allocation", on_delete=models.PROTECT, related_name="usage_records")
    hour = models.DateTimeField(help_text="Start of the UTC hour.")
    project = models.ForeignKey(
        "tenancy.Project", on_delete=models.PROTECT, related_name="usage_records", db_index=False
    )
    pool = models.ForeignKey("pools.GpuPool", on_delete=models.PROTECT, related_name="usage_records", db_index=False)
    kind = models.CharField(max_length=16, choices=SpecKind)
    product = models.CharField(max_length=32)
    profile_name = models.CharField(max_length=32, blank=True)
    replicas = models.PositiveSmallIntegerField(default=1)
    seconds = models.PositiveIntegerField(help_text="Reserved seconds in this hour (the clock ran).")
    health_credit_seconds = models.PositiveIntegerField(default=0, help_text="Withheld by a critical health event.")
    failed_credit_seconds = models.PositiveIntegerField(default=0, help_text="While provisioning had failed.")
    hourly_rate = models.DecimalField(max_digits=12, decimal_places=6)
    rate_card = models.ForeignKey(
        RateCard, null=True, on_delete=models.PROTECT, related_name="usage_records", db_index=False
    )
    sm_activity = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))],
        help_text="Average SM activity of the unit over the hour, 0..1; empty = not measured.",
    )
    energy_kwh = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        help_text="Energy attributed to the unit; empty = not measured.",
    )
    billed_on = models.ForeignKey(
        "Statement",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="billed_usage",
        db_index=False,
        editable=False,
        help_text="The finalised statement that billed this hour (its own month's, or a later one as carry-over); "
        "empty = not billed yet.",
    )

    objects = UsageRecordQuerySet.as_manager()

    class Meta:
        ordering = ["-hour", "allocation_id"]
        constraints = [
            # Hour first: one hour's rows are appended at the right edge of the index, not spread over it.
            models.UniqueConstraint(fields=["hour", "allocation"], name="billing_usagerecord_unique_hour_allocation"),
            models.CheckConstraint(
                condition=Q(seconds__gte=0, seconds__lte=HOUR_S), name="billing_usagerecord_seconds_within_hour"
            ),
            models.CheckConstraint(
                condition=Q(health_credit_seconds__lte=F("seconds") - F("failed_credit_seconds")),
                name="billing_usagerecord_credits_within_seconds",
            ),
        ]
        indexes = [
            models.Index(fields=["project", "hour"], name="billing_usage_project_hour"),
            # Credits are rare; refresh_credits finds the credited rows of a period through this.
            models.Index(
                fields=["hour", "allocation"],
                condition=Q(failed_credit_seconds__gt=0) | Q(health_credit_seconds__gt=0),
                name="billing_usage_credited",
            ),
            # Finalising stamps billed_on, so only open months and late (carry-over) hours stay in here:
            # a statement finds usage metered late into a finalised month without reading that month.
            models.Index(
                fields=["project", "hour"], condition=Q(billed_on__isnull=True), name="billing_usage_unbilled"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.allocation_id} @ {self.hour:%Y-%m-%d %H:00}: {self.seconds}s x {self.hourly_rate}"

    @property
    def spec(self) -> SpecKey:
        return spec_key(self.kind, self.product, self.profile_name, self.replicas)

    @property
    def reserved_amount(self) -> Decimal:
        """Unrounded: rate x seconds / 3600."""
        return self.hourly_rate * self.seconds / HOUR_S

    @property
    def used_amount(self) -> Decimal | None:
        return None if self.sm_activity is None else self.reserved_amount * self.sm_activity


class Statement(models.Model):
    """One project's bill for one calendar month (UTC): draft while it may change, then finalised forever."""

    # What a statement shows, in order: the admin's read-only form and the API's serializer.
    SUMMARY_FIELDS = (
        "period",
        "state",
        "currency",
        "reserved_hours",
        *STATEMENT_AMOUNTS,
        "energy_kwh",
        "generated_at",
        "finalised_at",
    )

    project = models.ForeignKey("tenancy.Project", on_delete=models.PROTECT, related_name="statements")
    period = models.DateField(help_text="First day of the month (UTC).")
    state = models.CharField(max_length=16, choices=StatementState, default=StatementState.DRAFT, editable=False)
    currency = models.CharField(max_length=3, default=billing_currency, editable=False)
    reserved_hours = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal(0), editable=False)
    reserved_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0), editable=False)
    credit_amount = models.DecimalField(
        max_digits=14, decimal_places=2, default=Decimal(0), editable=False, help_text="Negative or zero."
    )
    adjustment_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0), editable=False)
    total_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0), editable=False)
    used_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True, editable=False)
    idle_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True, editable=False)
    unmeasured_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0), editable=False)
    energy_kwh = models.DecimalField(max_digits=16, decimal_places=6, null=True, blank=True, editable=False)
    generated_at = models.DateTimeField(null=True, blank=True, editable=False)
    finalised_at = models.DateTimeField(null=True, blank=True, editable=False)
    finalised_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )

    class Meta:
        ordering = ["-period", "project_id"]
        permissions = [("finalise_statement", "Can finalise statements")]
        constraints = [
            models.UniqueConstraint(fields=["project", "period"], name="billing_statement_unique_project_period"),
        ]
        indexes = [models.Index(fields=["period", "state"], name="billing_statement_period_state")]

    def __str__(self) -> str:
        return f"{self.project} {self.period:%Y-%m} ({self.state})"

    def save(self, *args, **kwargs):
        if self._stored_finalised():
            raise StatementFinalised(f"statement {self.pk} is finalised and never changes")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if self._stored_finalised():
            raise StatementFinalised(f"statement {self.pk} is finalised and never changes")
        return super().delete(*args, **kwargs)

    @property
    def is_finalised(self) -> bool:
        return self.state == StatementState.FINALISED

    def _stored_finalised(self) -> bool:
        return self.pk is not None and Statement.objects.filter(pk=self.pk, state=StatementState.FINALISED).exists()


LINE_ORDER = {
    LineType.USAGE: 0,
    LineType.CARRY_OVER: 0,  # with the usage; ordered after it by usage_period
    LineType.FAILED_CREDIT: 1,
    LineType.HEALTH_CREDIT: 2,
    LineType.BORROWED: 0,  # a charge, with the usage
    LineType.LENT_CREDIT: 2,
    LineType.TRESPASS: 3,
    LineType.NOTICE: 4,
    LineType.ADJUSTMENT: 5,
}


class StatementLine(models.Model):
    """A line of a statement: reserved usage or a credit per pool, spec and rate; or an operator's adjustment."""

    # What a line says it cost, in order: the admin's inline, the API's serializer and the CSV export.
    FIGURE_FIELDS = (
        "hourly_rate",
        "hours",
        "amount",
        "used_amount",
        "idle_amount",
        "unmeasured_amount",
        "sm_activity",
        "energy_kwh",
    )
    # What it was for: the spec of a usage or credit line.
    SPEC_FIELDS = ("kind", "product", "profile_name", "replicas", "description")

    statement = models.ForeignKey(Statement, on_delete=models.CASCADE, related_name="lines")
    line_type = models.CharField(max_length=16, choices=LineType)
    position = models.PositiveSmallIntegerField(
        default=0, editable=False, help_text="Usage first, then credits, then adjustments (LINE_ORDER)."
    )
    pool = models.ForeignKey("pools.GpuPool", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=16, choices=SpecKind, blank=True)
    product = models.CharField(max_length=32, blank=True)
    profile_name = models.CharField(max_length=32, blank=True)
    replicas = models.PositiveSmallIntegerField(default=1)
    description = models.CharField(max_length=200)
    hourly_rate = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    hours = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal(0))
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    used_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    idle_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    unmeasured_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    sm_activity = models.DecimalField(max_digits=5, decimal_places=4, null=True, blank=True)
    energy_kwh = models.DecimalField(max_digits=16, decimal_places=6, null=True, blank=True)
    reason = models.TextField(blank=True)
    usage_period = models.DateField(
        null=True,
        blank=True,
        help_text="Carry-over lines (and their credits): the month the usage was metered in, "
        "whose statement was already finalised.",
    )
    corrects = models.ForeignKey(
        Statement,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="corrections",
        help_text="The finalised statement this adjustment corrects.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = [
            "statement_id",
            "position",
            F("usage_period").asc(nulls_first=True),
            "pool_id",
            "product",
            "kind",
            "profile_name",
            "hourly_rate",
            "id",
        ]
        constraints = [
            models.CheckConstraint(
                condition=~Q(line_type=LineType.ADJUSTMENT) | ~Q(reason=""),
                name="billing_statementline_adjustment_has_reason",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.description}: {self.amount}"

    def save(self, *args, **kwargs):
        if self._statement_finalised():
            raise StatementFinalised(f"statement {self.statement_id} is finalised; its lines never change")
        self.position = LINE_ORDER[self.line_type]
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if self._statement_finalised():
            raise StatementFinalised(f"statement {self.statement_id} is finalised; its lines never change")
        return super().delete(*args, **kwargs)

    def _statement_finalised(self) -> bool:
        return Statement.objects.filter(pk=self.statement_id, state=StatementState.FINALISED).exists()


class BillingRun(models.Model):
    """One metering pass or month close: what the admin and the API show, never Celery's results."""

    kind = models.CharField(max_length=16, choices=RunKind)
    period = models.DateField(null=True, blank=True, help_text="Month closed (close runs).")
    status = models.CharField(max_length=16, choices=RunStatus, default=RunStatus.RUNNING)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    hours_metered = models.PositiveIntegerField(default=0)
    records_written = models.PositiveIntegerField(default=0)
    statements = models.PositiveIntegerField(default=0)
    metered_until = models.DateTimeField(null=True, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error = models.TextField(blank=True)
    task_id = models.CharField(max_length=64, blank=True)
    claimed_by = models.CharField(max_length=64, blank=True, help_text="The worker's task running this close.")
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="A running close's lease: billing.recovery.sweep() re-enqueues after it."
    )

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["kind", "-started_at"], name="billing_run_kind_recent")]

    def __str__(self) -> str:
        what = f"close {self.period:%Y-%m}" if self.kind == RunKind.CLOSE and self.period else self.get_kind_display()
        return f"{what} @ {self.started_at:%Y-%m-%d %H:%M} ({self.status})"
