"""`manage.py demo` runs with DEBUG=1 and per-install keys generated once under var/ (gpuaas/demo/env.py)."""

import os
import stat

from cryptography.fernet import Fernet

from gpuaas.demo.env import demo_environment

NAMES = (
    "DEBUG",
    "SECRET_KEY",
    "CREDENTIALS_KEYS",
    "CREDENTIALS_KEY",
    "OIDC_ISSUER",
    "OIDC_CLIENT_ID",
    "OIDC_CLIENT_SECRET",
    "OIDC_PROVIDER_NAME",
)


def clean_env(monkeypatch, tmp_path):
    for name in NAMES:
        monkeypatch.setenv(name, "")  # recorded, so what demo_environment() sets is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPUAAS_VAR_DIR", str(tmp_path))


def test_demo_generates_keys_once_and_reuses_them(monkeypatch, tmp_path):
    clean_env(monkeypatch, tmp_path)
    demo_environment()
    first = {name: os.environ.get(name) for name in NAMES}
    assert first["DEBUG"] == "1"
    assert len(first["SECRET_KEY"]) >= 50
    Fernet(first["CREDENTIALS_KEYS"])  # a valid key
    for name in ("secret_key", "credentials_key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600

    clean_env(monkeypatch, tmp_path)
    demo_environment()
    assert {name: os.environ.get(name) for name in NAMES} == first


def test_demo_keeps_what_the_environment_sets(monkeypatch, tmp_path):
    clean_env(monkeypatch, tmp_path)
    monkeypatch.setenv("SECRET_KEY", "s" * 60)
    monkeypatch.setenv("CREDENTIALS_KEY", "k")
    demo_environment()
    assert os.environ["SECRET_KEY"] == "s" * 60
    assert "CREDENTIALS_KEYS" not in os.environ
    assert not (tmp_path / "secret_key").exists() and not (tmp_path / "credentials_key").exists()


def test_demo_signs_in_through_the_simulators_provider_unless_told_otherwise(monkeypatch, tmp_path):
    from gpuaas.demo.env import SIM_OIDC_ISSUER

    clean_env(monkeypatch, tmp_path)
    demo_environment()
    assert (os.environ["OIDC_ISSUER"], os.environ["OIDC_CLIENT_ID"]) == (SIM_OIDC_ISSUER, "gpuaas-demo")

    clean_env(monkeypatch, tmp_path)
    monkeypatch.setenv("OIDC_ISSUER", "")  # `OIDC_ISSUER= make demo`: local passwords only
    demo_environment()
    assert os.environ["OIDC_ISSUER"] == "" and "OIDC_CLIENT_ID" not in os.environ
