"""Notification settings pages: a user's own preferences (/accounts/notifications/) and a project's
webhooks (/projects/<slug>/notifications/).

Scopes (core.scopes): own preferences are OWN_USER (only request.user's rows, for the projects the
user belongs to); a project's page is PROJECT: every role reads it (another project's is a 404), only
the project's admins and operators holding notifications.change_webhookendpoint change its webhooks
(others get 403, nothing written). Secrets are shown to those who may change them.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from core.scopes import Scope, scoped
from tenancy import roles
from tenancy.models import Project

from .forms import PreferenceForm, WebhookForm
from .models import Preference, WebhookEndpoint


def can_manage_webhooks(user, project: Project) -> bool:
    """The project's admins, and operators holding the change permission."""
    if roles.operator_can(user, "notifications.change_webhookendpoint"):
        return True
    return roles.has_project_perm(user, project, "manage_members")


def member_projects(user):
    """The projects the user holds a role in (an operator sees every project, but is told only about these)."""
    names = user.groups.filter(name__startswith="project:").values_list("name", flat=True)
    return Project.objects.filter(slug__in={name.split(":")[1] for name in names})


@never_cache
@scoped(Scope.OWN_USER)
@require_http_methods(["GET", "POST"])
def my_preferences(request):
    """The signed-in user's preferences, one form per project they belong to."""
    projects = list(member_projects(request.user).order_by("slug"))
    prefs = {p.project_id: p for p in Preference.objects.filter(user=request.user, project__in=projects)}
    data = request.POST if request.method == "POST" else None
    forms_by_project = [
        (project, PreferenceForm.for_preference(prefs.get(project.pk), data=data, prefix=f"p{project.pk}"))
        for project in projects
    ]
    if data is not None and all(form.is_valid() for _, form in forms_by_project):
        for project, form in forms_by_project:
            form.save(user=request.user, project=project)
        messages.success(request, "Notification preferences saved.")
        return redirect("account_notifications")
    return render(request, "notifications/preferences.html", {"forms": forms_by_project})


@never_cache
@scoped(Scope.PROJECT)
@require_http_methods(["GET", "POST"])
def project_notifications(request, slug: str):
    """The project's webhooks: listed to every role; added, enabled/disabled or deleted by its admins."""
    project = roles.projects_for(request.user).filter(slug=slug).first()
    if project is None:
        raise Http404("No such project")
    manage = can_manage_webhooks(request.user, project)
    form = WebhookForm(project=project)
    if request.method == "POST":
        if not manage:
            raise PermissionDenied("Only the project's admins change its webhooks.")
        target = request.POST.get("endpoint", "")
        if target:
            endpoint = WebhookEndpoint.objects.filter(project=project, pk=target if target.isdigit() else 0).first()
            if endpoint is None:
                raise Http404("No such webhook")
            action = request.POST.get("action")
            if action == "delete":
                endpoint.delete()
                messages.success(request, f"Webhook {endpoint.name} deleted.")
            elif action in ("enable", "disable"):
                WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=action == "enable")
                messages.success(request, f"Webhook {endpoint.name} {action}d.")
            else:
                return render(
                    request,
                    "notifications/project.html",
                    _context(project, form, manage, error="Choose delete, enable or disable."),
                    status=400,
                )
            return redirect("projects:notifications", project.slug)
        form = WebhookForm(request.POST, project=project)
        if form.is_valid():
            form.instance.created_by = request.user
            endpoint = form.save()
            messages.success(request, f"Webhook {endpoint.name} added; its signing secret is shown below.")
            return redirect("projects:notifications", project.slug)
        return render(request, "notifications/project.html", _context(project, form, manage), status=400)
    return render(request, "notifications/project.html", _context(project, form, manage))


def _context(project, form, manage, error: str = "") -> dict:
    return {
        "project": project,
        "form": form,
        "manage": manage,
        "error": error,
        "endpoints": WebhookEndpoint.objects.filter(project=project).order_by("name", "pk"),
    }


project_urlpatterns = [path("<slug:slug>/notifications/", project_notifications, name="notifications")]
account_urlpatterns = [path("accounts/notifications/", my_preferences, name="account_notifications")]
