"""The policy console: every setting of settings.POLICY with the value in force, and the operators' changes."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin

from .models import PolicyValue
from .values import policy


class PolicyValueForm(forms.ModelForm):
    class Meta:
        model = PolicyValue
        fields = ["name", "value", "reason"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "name" in self.fields and not self.instance.pk:  # add: only settings nobody has changed yet
            taken = set(PolicyValue.objects.values_list("name", flat=True))
            self.fields["name"].choices = [(n, n) for n in settings.POLICY if n not in taken]


@admin.register(PolicyValue)
class PolicyValueAdmin(admin.ModelAdmin):
    form = PolicyValueForm
    list_display = ["name", "value", "setting", "reason", "changed_by", "changed_at"]
    list_select_related = ["changed_by"]
    search_fields = ["name", "reason"]

    def get_readonly_fields(self, request, obj=None):
        return ["name"] if obj is not None else []

    @admin.display(description="environment's value")
    def setting(self, obj: PolicyValue):
        return getattr(settings, obj.name)

    def save_model(self, request, obj, form, change):
        obj.changed_by = request.user
        super().save_model(request, obj, form, change)

    def changelist_view(self, request, extra_context=None):
        """Above the operators' rows: every policy setting, what it decides, and the value in force now."""
        in_force = [
            {
                "name": name,
                "help": help_text,
                "minimum": minimum,
                "setting": getattr(settings, name),
                "value": policy(name),
            }
            for name, (minimum, help_text) in settings.POLICY.items()
        ]
        return super().changelist_view(
            request, {**(extra_context or {}), "policy_in_force": in_force, "policy_cache_s": settings.POLICY_CACHE_S}
        )
