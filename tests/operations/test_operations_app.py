"""The operations layer's seams: capacity and pools never import it, its tasks keep their queued names,
and the admin site is gpuaas's own class (no patched get_urls)."""

import ast
from pathlib import Path

from django.conf import settings
from django.contrib import admin
from django.urls import reverse

from gpuaas.admin import GpuaasAdminSite
from core.celery import app

REPO = Path(settings.BASE_DIR)


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_capacity_and_pools_never_import_operations():
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for app_dir in ("capacity", "pools")
        for path in sorted((REPO / app_dir).rglob("*.py"))
        for name in sorted(_imported_modules(path))
        if name == "operations" or name.startswith("operations.")
    ]
    assert offenders == []


def test_reconfiguration_tasks_keep_their_capacity_names():
    app.loader.import_default_modules()
    assert app.tasks["capacity.tasks.reconfiguration_step_task"].__module__ == "operations.tasks"
    assert app.tasks["capacity.tasks.sweep_reconfigurations_task"].__module__ == "operations.tasks"
    beat = settings.CELERY_BEAT_SCHEDULE["capacity-sweep-reconfigurations"]
    assert beat["task"] in app.tasks


def test_the_admin_site_is_gpuaas_site_with_the_dashboard():
    assert isinstance(admin.site, GpuaasAdminSite)
    assert "get_urls" not in vars(admin.site._wrapped)  # a method of the class, not patched on the instance
    assert reverse("admin:gpuaas_dashboard_data") == "/admin/dashboard/data.json"
    assert reverse("admin:capacity_take_offline") == "/admin/capacity/migreconfiguration/take-offline/"
