"""Encryption of stored cluster credentials (Fernet), keyed by settings.CREDENTIALS_KEYS.

The first key encrypts; every key decrypts (cryptography's MultiFernet), so a key can be rotated
without downtime: put the new key first, run `manage.py rotate-credentials`, then drop the old one.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(key) for key in settings.CREDENTIALS_KEYS])


def encrypt(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError(
            "stored credentials cannot be decrypted with any of CREDENTIALS_KEYS: was a key removed or changed?"
        ) from None


def rotate(token: str) -> str:
    """The token re-encrypted under the first key. ValueError if no key decrypts it."""
    try:
        return _fernet().rotate(token.encode()).decode()
    except InvalidToken:
        raise ValueError("cannot be decrypted with any of CREDENTIALS_KEYS") from None


def is_current(token: str) -> bool:
    """Whether the first (encrypting) key already decrypts the token."""
    try:
        Fernet(settings.CREDENTIALS_KEYS[0]).decrypt(token.encode())
    except InvalidToken:
        return False
    return True
