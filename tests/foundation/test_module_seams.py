"""Modules along their seams: backend SQL behind one chooser per app, each library in its adapter, benchmarks apart."""

import ast
import re
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
APPS = (
    "tenancy",
    "core",
    "capacity",
    "pricing",
    "pools",
    "scheduling",
    "operations",
    "monitoring",
    "billing",
    "notifications",
    "gpuaas",
)
# The one place per app that asks which database it runs on; migration helpers run on the schema
# editor's connection, and benchmarks report the database they measured.
VENDOR_ALLOWED = {
    "capacity/backends/__init__.py",
    "monitoring/backends/__init__.py",
    "billing/backends/__init__.py",
    "billing/triggers.py",
    "core/admin_paging.py",  # the kernel's one: estimated changelist counts come from PostgreSQL's statistics
}


def _sources(*tops: str):
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_business_code_never_asks_which_database_it_runs_on():
    asking = [name for name, text in _sources(*APPS) if ".vendor" in text and name not in VENDOR_ALLOWED]
    assert asking == []


@pytest.mark.parametrize("app", ["capacity", "monitoring", "billing"])
def test_each_backend_seam_offers_the_same_functions_on_both_databases(app):
    from importlib import import_module

    chooser = import_module(f"{app}.backends")
    postgresql, sqlite = import_module(f"{app}.backends.postgresql"), import_module(f"{app}.backends.sqlite")
    chosen = postgresql if connection.vendor == "postgresql" else sqlite
    exported = [name for name, value in vars(chooser).items() if callable(value) and not name.startswith("_")]
    assert exported
    for name in exported:
        assert getattr(chooser, name) is getattr(chosen, name)
        assert callable(getattr(postgresql, name)) and callable(getattr(sqlite, name))


@pytest.mark.parametrize(
    ("library", "adapter"),
    [
        ("pynvml", "capacity/adapters/nvml/"),
        ("kubernetes", "capacity/adapters/kubernetes/"),
        ("redis", "capacity/agent/transport.py"),  # the ingest stream; Celery's own Redis use goes through kombu
    ],
)
def test_only_the_adapter_imports_its_library(library, adapter):
    importers = set()
    for name, text in _sources(*APPS, "benchmarks"):
        for node in ast.walk(ast.parse(text)):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module or ""]
            if any(m == library or m.startswith(f"{library}.") for m in modules):
                importers.add(name)
    assert importers and all(name.startswith(adapter) for name in importers)


def test_no_app_imports_the_benchmarks_package():
    pattern = re.compile(r"^\s*(from|import)\s+benchmarks\b", re.MULTILINE)
    importers = [name for name, text in _sources(*APPS) if pattern.search(text)]
    assert importers == ["gpuaas/management/commands/bench.py"]


def test_settings_are_grouped_not_appended():
    parts = sorted((ROOT / "gpuaas" / "settings").glob("*.py"))
    assert parts and all("--- end" not in part.read_text() for part in parts)


def test_function_local_imports_of_the_project_say_which_cycle_they_break():
    """Imports sit at module top; one inside a function is kept only for a real cycle and says so."""
    packages = {*APPS, "benchmarks"}
    unexplained = []
    for name, text in _sources(*APPS, "benchmarks"):
        lines = text.splitlines()
        for function in ast.walk(ast.parse(text)):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom):
                    ours = node.level > 0 or (node.module or "").split(".")[0] in packages
                elif isinstance(node, ast.Import):
                    ours = any(alias.name.split(".")[0] in packages for alias in node.names)
                else:
                    continue
                if ours and "cycle:" not in lines[node.lineno - 1]:
                    unexplained.append(f"{name}:{node.lineno}")
    assert unexplained == []
