"""PolicyValue: an operator's value for one setting of settings.POLICY."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models


def policy_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in settings.POLICY]


class PolicyValue(models.Model):
    """Overrides the setting `name` while it exists; deleting it returns to the environment's value."""

    name = models.CharField(max_length=64, unique=True, choices=policy_choices)
    value = models.JSONField(help_text="An integer, or true/false for a switch.")
    reason = models.CharField(max_length=200, blank=True, help_text="Why it was changed (shown in the list).")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "policy value"

    def __str__(self) -> str:
        return f"{self.name} = {self.value}"

    def clean(self) -> None:
        """The value must have the setting's kind (switch or integer) and respect its minimum."""
        if self.name not in settings.POLICY:
            raise ValidationError({"name": f"{self.name!r} is not a policy setting."})
        minimum, _ = settings.POLICY[self.name]
        default = getattr(settings, self.name)
        if isinstance(default, bool):
            if not isinstance(self.value, bool):
                raise ValidationError({"value": "This setting is a switch: give true or false."})
        elif isinstance(self.value, bool) or not isinstance(self.value, int):
            raise ValidationError({"value": "Give a whole number."})
        elif minimum is not None and self.value < minimum:
            raise ValidationError({"value": f"Give at least {minimum}."})
