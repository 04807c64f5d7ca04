"""The operators' console for notifications: events and their deliveries (read-only, with a retry action),
webhook endpoints and members' preferences (editable)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from core.admin_permissions import ReadOnlyInline

from . import services
from .choices import PROJECT_KINDS
from .models import Delivery, Event, Preference, WebhookEndpoint


class DeliveryInline(ReadOnlyInline):
    model = Delivery
    fields = ["channel", "address", "state", "attempts", "last_status", "last_error", "sent_at"]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "kind", "project", "subject"]
    list_filter = ["kind"]
    list_select_related = ["project"]
    search_fields = ["key", "subject"]
    readonly_fields = [
        "key",
        "kind",
        "project",
        "subject",
        "body",
        "payload",
        "occurred_at",
        "created_at",
        "fanned_out_at",
    ]
    inlines = [DeliveryInline]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["created_at", "event", "channel", "address", "state", "attempts", "last_status", "sent_at"]
    list_filter = ["state", "channel"]
    list_select_related = ["event"]
    search_fields = ["address", "dedup_key"]
    readonly_fields = [f.name for f in Delivery._meta.fields]
    actions = ["send_again"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.action(description="Send the selected failed deliveries again", permissions=["view"])
    def send_again(self, request, queryset):
        count = services.send_again(list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{count} deliveries sent again.", messages.SUCCESS)


class KindsField(forms.MultipleChoiceField):
    widget = forms.CheckboxSelectMultiple

    def __init__(self, **kwargs):
        super().__init__(choices=[(str(k), k.label) for k in PROJECT_KINDS], required=False, **kwargs)


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https")
    events = KindsField(help_text="None ticked: every kind.")

    class Meta:
        model = WebhookEndpoint
        fields = ["project", "name", "url", "flavour", "events", "enabled", "secret"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ["name", "project", "flavour", "url", "enabled"]
    list_filter = ["flavour", "enabled"]
    list_select_related = ["project"]


class PreferenceForm(forms.ModelForm):
    muted = KindsField(help_text="Kinds this user is not told about.")

    class Meta:
        model = Preference
        fields = ["user", "project", "email", "muted"]


@admin.register(Preference)
class PreferenceAdmin(admin.ModelAdmin):
    form = PreferenceForm
    list_display = ["user", "project", "email"]
    list_select_related = ["user", "project"]
    raw_id_fields = ["user"]
