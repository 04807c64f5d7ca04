"""Settings for the test suite (pyproject's DJANGO_SETTINGS_MODULE): gpuaas.settings with DEBUG=1.

The production defaults are safe (DEBUG off, SECRET_KEY and CREDENTIALS_KEYS required, real NVML);
the suite runs like `make demo`: DEBUG=1 at import (simulated NVML, the development keys). Django's
test runner still sets settings.DEBUG = False while tests run. Set before gpuaas.settings is imported,
and inherited by the processes the tests start (the demo, Celery workers, `manage.py` subprocesses).
"""

import os

os.environ.setdefault("DEBUG", "1")

from .settings import *  # noqa: E402, F403

# Files of the embedded cache: apart from a running demo's (tests clear theirs before each test).
if CACHES["default"]["BACKEND"].endswith("FileBasedCache"):  # noqa: F405
    CACHES["default"]["LOCATION"] = str(VAR_DIR / "test-cache")  # noqa: F405

# Fast hashing: the login tests post many passwords (production keeps Django's default hashers).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The simulated MIG manager's mounted ConfigMap is refreshed at once unless a test chooses a delay
# (SimState(configmap_sync_delay=...)) and sets this with it.
MIG_PARTED_SYNC_S = 0
