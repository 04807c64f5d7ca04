"""Company sign-in's settings errors stop start-up with one readable line naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "x7Gq2-p9LmZr4vT8wKc1NbYe6HsJd3UaQf5Wi0Ro_lXtMgVnEk2Ps"
PRODUCTION = {"DEBUG": "0", "SECRET_KEY": SECRET, "ALLOWED_HOSTS": "x", "CREDENTIALS_KEYS": "k" * 43 + "="}


def run_check(**env):
    full = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "gpuaas.settings", "DEBUG": "1"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=full, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"OIDC_ISSUER": "https://idp.example.com"}, "OIDC_CLIENT_ID is required when OIDC_ISSUER is set"),
        (
            {"OIDC_ISSUER": "https://idp.example.com", "OIDC_CLIENT_ID": "gpuaas"},
            "OIDC_CLIENT_SECRET is required when OIDC_ISSUER is set",
        ),
        (
            {**PRODUCTION, "OIDC_ISSUER": "http://idp", "OIDC_CLIENT_ID": "c", "OIDC_CLIENT_SECRET": "s"},
            "OIDC_ISSUER must be an https:// URL",
        ),
        ({"LOCAL_PASSWORDS": "0"}, "LOCAL_PASSWORDS=0 needs OIDC_ISSUER"),
    ],
)
def test_bad_oidc_settings_stop_with_one_line(env, needle):
    result = run_check(**env)
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert lines == [lines[-1]], result.stderr
    assert lines[-1].startswith("gpuaas configuration error: ")
    assert needle in lines[-1]


def test_good_oidc_settings_start():
    env = {"OIDC_ISSUER": "https://idp.example.com", "OIDC_CLIENT_ID": "c", "OIDC_CLIENT_SECRET": "s"}
    assert run_check(**env, LOCAL_PASSWORDS="0").returncode == 0
