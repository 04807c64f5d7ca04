"""The project view's forms. They validate and write through the API's own serializers and services
(PoolRequestSerializer -> pools.services.create_request, ApiTokenSerializer -> ApiToken.issue), so a
request made on the page and one made over the API pass the same checks; nothing is re-implemented here.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from rest_framework import serializers as drf

from policies import policy
from pools.api.request_serializers import PoolRequestSerializer
from pools.api.serializers import TOO_MANY_UNITS, ApiTokenSerializer
from pools.choices import Isolation, WorkloadType
from pools.models import PoolRequest
from tenancy.models import ApiToken, Project


class _SerializerForm(forms.Form):
    """A Django form whose clean() hands the data to a DRF serializer and maps its errors to fields."""

    serializer_class: type[drf.Serializer]

    def __init__(self, *args, request, **kwargs):
        super().__init__(*args, **kwargs)
        self.request = request
        self.serializer: drf.Serializer | None = None

    def serializer_data(self) -> dict:
        return {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        self.serializer = self.serializer_class(data=self.serializer_data(), context={"request": self.request})
        if not self.serializer.is_valid():
            for field, messages in self.serializer.errors.items():
                target = field if field in self.fields else None
                for message in messages if isinstance(messages, list) else [messages]:
                    self.add_error(target, str(message))
        return cleaned


class PoolRequestForm(_SerializerForm):
    """Ask for a pool in one project: submitted for approval at once."""

    serializer_class = PoolRequestSerializer

    name = forms.CharField(max_length=100, help_text="A name for the pool, e.g. vision-inference.")
    workload_type = forms.ChoiceField(choices=WorkloadType.choices, initial=WorkloadType.INFERENCE)
    isolation = forms.ChoiceField(
        choices=[("", "Any (decided by the spec)"), *Isolation.choices], required=False,
        help_text="MIG instances, full GPUs or time-slice replicas.",
    )  # fmt: skip
    product = forms.CharField(max_length=32, required=False, help_text="e.g. H100-80GB; empty: any product.")
    profile_name = forms.CharField(max_length=32, required=False, label="MIG profile", help_text="e.g. 3g.40gb.")
    memory_gib = forms.IntegerField(
        min_value=1, required=False, label="Memory (GiB)", help_text="Instead of a profile: the smallest that fits."
    )
    count = forms.IntegerField(min_value=1, initial=1)  # its maximum is set per form: _count_field()
    end_at = forms.DateTimeField(
        required=False, label="Until",
        help_text="Optional end, a date and time in UTC; empty: until the pool is released.",
        # The value a datetime-local input sends and accepts back (2026-12-06T18:30), so it survives a re-display.
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )  # fmt: skip
    justification = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=2000)

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.fields["count"] = _count_field()

    def serializer_data(self) -> dict:
        # The page promises "it waits for capacity": a request made here waits in the queue when short.
        return super().serializer_data() | {"project": self.project.pk, "submit": True, "wait_if_full": True}

    def draft(self) -> PoolRequest:
        """The validated request, unsaved: what the availability check (units.verdict) reads."""
        values = dict(self.serializer.validated_data)
        values.pop("submit", None)
        return PoolRequest(**values)

    def save(self) -> PoolRequest:
        return self.serializer.save()


def _count_field() -> forms.IntegerField:
    """Count, capped where the API caps it (POOL_REQUEST_MAX_UNITS, read now, with the API's message)."""
    cap = policy("POOL_REQUEST_MAX_UNITS")
    return forms.IntegerField(
        min_value=1,
        max_value=cap,
        initial=1,
        help_text=f"Units, 1 to {cap}.",
        error_messages={"max_value": TOO_MANY_UNITS.format(max_value=cap)},
    )


class ApiTokenForm(_SerializerForm):
    serializer_class = ApiTokenSerializer

    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. ci-pipeline.")
    expires_in_days = forms.IntegerField(
        min_value=1, max_value=3650, required=False, initial=90, label="Expires in (days)",
    )  # fmt: skip

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Say what an empty field gives: the longest life allowed (ApiToken.latest_expiry), which is
        # "never" only where API_TOKEN_MAX_LIFETIME_DAYS is 0 (docs/security.md "API tokens").
        days = settings.API_TOKEN_MAX_LIFETIME_DAYS
        field = self.fields["expires_in_days"]
        if days:
            field.widget.attrs["max"] = days
            field.initial = min(field.initial, days)
            field.help_text = f"Every token expires, at most {days} days from now. Empty: {days} days."
        else:
            field.help_text = "Empty: never expires (no maximum lifetime is set)."

    def save(self) -> ApiToken:
        """The new token; its `plain_key` is the raw key, shown once and never stored."""
        return self.serializer.save()
