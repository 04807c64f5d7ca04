"""An action that asks for a reason on an intermediate page first, then runs a workflow service per row."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from ..exceptions import DomainError


class ReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), required=False, max_length=2000)

    def __init__(self, *args, reason_required: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reason"].required = reason_required


def run_with_reason(model_admin, request, queryset, *, verb: str, title: str, run, reason_required=False):
    """An admin action in two steps: a page asking for the reason, then `run(obj, reason)` on each object.

    Objects are handled one by one in primary-key order, each in its own transaction (the services'),
    so one refusal does not undo the others; refusals are listed in a warning.
    """
    if "apply" in request.POST:
        form = ReasonForm(request.POST, reason_required=reason_required)
        if form.is_valid():
            done, refused = 0, []
            for obj in queryset.order_by("pk"):
                try:
                    run(obj, form.cleaned_data["reason"])
                    done += 1
                except DomainError as exc:
                    refused.append(f"#{obj.pk}: {exc.message}")
            noun = model_admin.model._meta.verbose_name if done == 1 else model_admin.model._meta.verbose_name_plural
            model_admin.message_user(request, f"{done} {noun} {verb}.", messages.SUCCESS)
            if refused:
                model_admin.message_user(request, "Refused: " + " | ".join(refused), messages.WARNING)
            return None
    else:
        form = ReasonForm(reason_required=reason_required)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "objects": queryset.order_by("pk"),
        "form": form,
        "action": request.POST.get("action", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "verb": verb,
    }
    return TemplateResponse(request, "admin/pools/reason_form.html", context)
