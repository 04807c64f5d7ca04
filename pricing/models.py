"""Rate cards: versioned price lists, one hourly price per spec (kind, product, profile, replicas).

The tables keep billing's names (`billing_ratecard`, `billing_ratecardentry`) and constraint names:
the models moved here from billing without touching the database (pricing.0001, state only).
Billing's usage records point at the card that priced them; a card never asks about them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from capacity.choices import SpecKind

from .rates import SpecKey, spec_key


def billing_currency() -> str:
    """The currency of every card and statement (BILLING_CURRENCY)."""
    return settings.BILLING_CURRENCY


def default_vgpu_licence() -> Decimal:
    return Decimal(settings.BILLING_VGPU_LICENCE_HOURLY)


class RateCardQuerySet(models.QuerySet):
    def effective_at(self, when: datetime) -> RateCard | None:
        """The card in force for the hour starting at `when` (the latest one effective at or before it)."""
        return self.filter(effective_from__lte=when).order_by("-effective_from").first()


class RateCard(models.Model):
    """A versioned price list. It applies to every hour starting at or after `effective_from`, until the next card.

    Prices change on hour boundaries only: a card's effective_from is a whole hour (clean()), and a
    card effective at 10:30 would apply from the 11:00 hour. Cards are never edited once in force:
    to change a price, add a card.
    """

    name = models.CharField(max_length=100)
    currency = models.CharField(max_length=3, default=billing_currency, editable=False)
    effective_from = models.DateTimeField(unique=True, help_text="UTC, on a whole hour.")
    notes = models.TextField(blank=True)
    off_peak_start_hour = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(23)], help_text="UTC hour off-peak starts; empty = none."
    )
    off_peak_end_hour = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(23)], help_text="UTC hour off-peak ends (exclusive)."
    )
    off_peak_multiplier = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=Decimal(1),
        validators=[MinValueValidator(Decimal("0.001"))],
        help_text="Every price x this in off-peak hours (0.6 = 40% off), so batch work moved there costs less.",
    )
    borrowed_multiplier = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=Decimal("0.5"),
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))],
        help_text="Best-effort rate of a borrowed (lent, preemptible) unit, as a fraction of its hourly price; "
        "the borrower pays it and the lender is credited the same.",
    )
    vgpu_licence_hourly = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        default=default_vgpu_licence,
        validators=[MinValueValidator(Decimal(0))],
        help_text="NVIDIA vGPU software licence per vGPU-hour, part of every vGPU price on this card "
        "(new cards start from BILLING_VGPU_LICENCE_HOURLY).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )

    objects = RateCardQuerySet.as_manager()

    class Meta:
        db_table = "billing_ratecard"
        ordering = ["-effective_from"]

    def __str__(self) -> str:
        return f"{self.name} (from {self.effective_from:%Y-%m-%d %H:%M} UTC)"

    def clean(self) -> None:
        if self.effective_from and (
            self.effective_from.minute or self.effective_from.second or self.effective_from.microsecond
        ):
            raise ValidationError({"effective_from": "Rate changes take effect on whole hours (minutes = 00:00)."})
        if (self.off_peak_start_hour is None) != (self.off_peak_end_hour is None):
            raise ValidationError({"off_peak_end_hour": "Give both the start and the end of off-peak, or neither."})
        if self.off_peak_start_hour is not None and self.off_peak_start_hour == self.off_peak_end_hour:
            raise ValidationError({"off_peak_end_hour": "Off-peak must end at another hour than it starts."})

    def is_off_peak(self, hour: datetime) -> bool:
        """Is the UTC hour starting at `hour` off-peak? A window may run past midnight (22 -> 6)."""
        start, end = self.off_peak_start_hour, self.off_peak_end_hour
        if start is None or end is None or start == end:
            return False
        h = hour.astimezone(UTC).hour
        return start <= h < end if start < end else (h >= start or h < end)

    def multiplier_at(self, hour: datetime) -> Decimal:
        return self.off_peak_multiplier if self.is_off_peak(hour) else Decimal(1)

    @property
    def in_force(self) -> bool:
        return self.effective_from <= timezone.now()

    def price_map(self) -> dict[SpecKey, Decimal]:
        return {entry.spec: entry.hourly_price for entry in self.entries.all()}


class RateCardEntry(models.Model):
    """The hourly price of one spec on one card. Derived entries follow the full-GPU price; overrides do not."""

    card = models.ForeignKey(RateCard, on_delete=models.CASCADE, related_name="entries")
    kind = models.CharField(max_length=16, choices=SpecKind)
    product = models.CharField(max_length=32, help_text="Catalog key, e.g. H100-80GB.")
    profile_name = models.CharField(max_length=32, blank=True, help_text="MIG profile; empty otherwise.")
    replicas = models.PositiveSmallIntegerField(default=1, help_text="Time-slice replicas per GPU; 1 otherwise.")
    hourly_price = models.DecimalField(max_digits=12, decimal_places=6, validators=[MinValueValidator(Decimal(0))])
    is_override = models.BooleanField(
        default=False, help_text="Set by hand: kept when the card's full-GPU price is re-derived."
    )
    rule = models.CharField(max_length=64, blank=True, help_text="How the price was derived.")

    class Meta:
        db_table = "billing_ratecardentry"
        ordering = ["card_id", "product", "kind", "profile_name", "replicas"]
        verbose_name_plural = "rate card entries"
        constraints = [
            models.UniqueConstraint(
                fields=["card", "kind", "product", "profile_name", "replicas"], name="billing_ratecardentry_unique_spec"
            ),
            models.CheckConstraint(condition=Q(hourly_price__gte=0), name="billing_ratecardentry_price_not_negative"),
            models.CheckConstraint(condition=Q(replicas__gte=1), name="billing_ratecardentry_replicas_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.spec.label()}: {self.hourly_price}/h"

    @property
    def spec(self) -> SpecKey:
        return spec_key(self.kind, self.product, self.profile_name, self.replicas)

    def clean(self) -> None:
        if self.kind == SpecKind.MIG and not self.profile_name:
            raise ValidationError({"profile_name": "A MIG entry names its profile."})
        if self.kind != SpecKind.MIG and self.profile_name:
            raise ValidationError({"profile_name": "Only MIG entries name a profile."})
        if self.kind not in (SpecKind.TIMESLICE, SpecKind.MPS, SpecKind.VGPU) and self.replicas != 1:
            raise ValidationError({"replicas": "Only time-slice, MPS and vGPU entries have replicas."})
