"""Operator console for pricing: rate cards and their entries (the admin's "Pricing" section).

Cards in force are read-only; a future card's derived entries follow its full-GPU prices
(pricing.services.rederive_card after each save).
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import admin
from django.db.models import Count
from django.utils import timezone

from . import services
from .models import RateCard, RateCardEntry

HOUR = timedelta(hours=1)


class RateCardForm(forms.ModelForm):
    class Meta:
        model = RateCard
        fields = [
            "name",
            "effective_from",
            "notes",
            "off_peak_start_hour",
            "off_peak_end_hour",
            "off_peak_multiplier",
            "borrowed_multiplier",
            "vgpu_licence_hourly",
        ]

    def clean_effective_from(self):
        value = self.cleaned_data["effective_from"]
        if value is not None and value <= timezone.now():
            raise forms.ValidationError("A new card takes effect in the future: history is never repriced.")
        return value


class RateCardEntryInline(admin.TabularInline):
    model = RateCardEntry
    fields = ["kind", "product", "profile_name", "replicas", "hourly_price", "is_override", "rule"]
    readonly_fields = ["rule"]
    extra = 0

    def _editable(self, obj) -> bool:
        return obj is None or not obj.in_force

    def has_add_permission(self, request, obj=None):
        return self._editable(obj) and super().has_add_permission(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._editable(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self._editable(obj) and super().has_delete_permission(request, obj)


@admin.register(RateCard)
class RateCardAdmin(admin.ModelAdmin):
    """Cards in force are read-only; to change prices, copy the current card to a future hour and edit the copy.

    After saving a future card, its derived (non-override) entries are recomputed from its full-GPU
    prices and missing MIG entries are added (pricing.services.rederive_card).
    """

    form = RateCardForm
    list_display = ["name", "effective_from", "currency", "entry_count", "in_force_now"]
    search_fields = ["name", "notes"]
    inlines = [RateCardEntryInline]
    actions = ["copy_to_next_hour"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(entry_count=Count("entries"))

    @admin.display(description="entries", ordering="entry_count")
    def entry_count(self, obj):
        return obj.entry_count

    @admin.display(description="in force", boolean=True)
    def in_force_now(self, obj):
        return obj.in_force

    def has_change_permission(self, request, obj=None):
        return (obj is None or not obj.in_force) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return (obj is None or not obj.in_force) and super().has_delete_permission(request, obj)

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        if not form.instance.in_force:
            services.rederive_card(form.instance)

    @admin.action(description="Copy to a new card effective from the next hour", permissions=["add"])
    def copy_to_next_hour(self, request, queryset):
        start = timezone.now().replace(minute=0, second=0, microsecond=0) + HOUR  # now is UTC (USE_TZ)
        done = 0
        for card in queryset.order_by("effective_from"):
            while RateCard.objects.filter(effective_from=start).exists():
                start += HOUR
            services.copy_rate_card(card, effective_from=start, actor=request.user)
            done += 1
        self.message_user(request, f"{done} rate card(s) copied; edit the copies before they take effect.")
