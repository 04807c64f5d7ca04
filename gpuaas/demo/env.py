"""The environment of `python manage.py demo` (and `bench`): DEBUG=1 and per-install keys kept under var/.

manage.py calls demo_environment() before Django reads its settings, so the demo, and every process
it starts (web server, worker, simulator), runs with DEBUG=1 (simulated NVML), a SECRET_KEY and a
CREDENTIALS_KEYS generated once for this install (var/secret_key, var/credentials_key, mode 0600), and
company sign-in through the simulator's identity provider (SIM_OIDC_ISSUER).
Variables already set in the environment win.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


def _kept(path: Path, make) -> str:
    """The secret stored at path, created (readable by this user only) on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(make())
    return path.read_text().strip()


# The simulator's identity provider (simcluster/oidc.py), which `manage.py demo` starts next to the
# simulated cluster when OIDC_ISSUER is this URL: company sign-in beside the demo's local passwords.
SIM_OIDC_PORT = 6480
SIM_OIDC_ISSUER = f"http://127.0.0.1:{SIM_OIDC_PORT}"


def demo_environment() -> None:
    from cryptography.fernet import Fernet

    var = Path(os.environ.get("GPUAAS_VAR_DIR") or BASE_DIR / "var")
    os.environ.setdefault("DEBUG", "1")
    os.environ.setdefault("MIG_PARTED_SYNC_S", "1")  # the simulator's mounted ConfigMaps refresh at once
    if not os.environ.get("SECRET_KEY"):
        os.environ["SECRET_KEY"] = _kept(var / "secret_key", lambda: secrets.token_urlsafe(50))
    if not (os.environ.get("CREDENTIALS_KEYS") or os.environ.get("CREDENTIALS_KEY")):
        os.environ["CREDENTIALS_KEYS"] = _kept(var / "credentials_key", lambda: Fernet.generate_key().decode())
    if "OIDC_ISSUER" not in os.environ:  # OIDC_ISSUER= (empty) keeps the demo on local passwords only
        from simcluster.oidc import DEMO_CLIENT

        os.environ["OIDC_ISSUER"] = SIM_OIDC_ISSUER
        os.environ.setdefault("OIDC_CLIENT_ID", DEMO_CLIENT.client_id)
        os.environ.setdefault("OIDC_CLIENT_SECRET", DEMO_CLIENT.secret)
        os.environ.setdefault("OIDC_PROVIDER_NAME", "the simulated identity provider")
