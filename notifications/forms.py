from __future__ import annotations

from django import forms

from .choices import PROJECT_KINDS
from .models import Preference, WebhookEndpoint

KIND_CHOICES = [(str(k), k.label) for k in PROJECT_KINDS]


class PreferenceForm(forms.Form):
    """One user's choice for one project: email on or off, and the kinds wanted (stored as the muted rest)."""

    email = forms.BooleanField(required=False, label="Email me this project's events")
    kinds = forms.MultipleChoiceField(
        choices=KIND_CHOICES, required=False, widget=forms.CheckboxSelectMultiple, label="Events"
    )

    @classmethod
    def for_preference(cls, preference: Preference | None, **kwargs) -> PreferenceForm:
        muted = set(preference.muted) if preference else set()
        initial = {
            "email": preference.email if preference else True,
            "kinds": [k for k, _ in KIND_CHOICES if k not in muted],
        }
        return cls(initial=initial, **kwargs)

    def save(self, *, user, project) -> Preference:
        wanted = set(self.cleaned_data["kinds"])
        preference, _ = Preference.objects.update_or_create(
            user=user,
            project=project,
            defaults={"email": self.cleaned_data["email"], "muted": [k for k, _ in KIND_CHOICES if k not in wanted]},
        )
        return preference


class WebhookForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https", help_text="http(s) URL that receives a POST per event.")
    events = forms.MultipleChoiceField(
        choices=KIND_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every kind.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["name", "url", "flavour", "events"]

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.instance.project = project

    def clean_url(self):
        url = self.cleaned_data["url"]
        if not url.lower().startswith(("http://", "https://")):
            raise forms.ValidationError("Give an http:// or https:// URL.")
        return url

    def clean_name(self):
        name = self.cleaned_data["name"]
        if WebhookEndpoint.objects.filter(project=self.instance.project, name=name).exists():
            raise forms.ValidationError("This project already has a webhook of that name.")
        return name
