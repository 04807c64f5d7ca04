"""Encryption of stored cluster credentials (Fernet), keyed by CREDENTIALS_KEY or SECRET_KEY."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    key = settings.CREDENTIALS_KEY
    if not key:
        key = base64.urlsafe_b64encode(hashlib.sha256(("gpuaas-credentials:" + settings.SECRET_KEY).encode()).digest())
    return Fernet(key)


def encrypt(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError("stored credentials cannot be decrypted: was CREDENTIALS_KEY or SECRET_KEY changed?") from None
