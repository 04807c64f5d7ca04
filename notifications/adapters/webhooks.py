"""The one module that talks HTTP to webhook endpoints (requests).

Signing: the body's bytes are signed with the endpoint's secret, HMAC-SHA256 over
``<timestamp>.<body>``; headers ``X-Gpuaas-Timestamp: <unix seconds>`` and
``X-Gpuaas-Signature: sha256=<hex>``, plus ``X-Gpuaas-Event`` (the kind) and ``X-Gpuaas-Delivery``
(the delivery's dedup key: a receiver may use it to drop a repeat). A receiver recomputes the HMAC
with its copy of the secret, compares in constant time and refuses old timestamps (replays).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass

import requests

SIGNATURE_HEADER = "X-Gpuaas-Signature"
TIMESTAMP_HEADER = "X-Gpuaas-Timestamp"
EVENT_HEADER = "X-Gpuaas-Event"
DELIVERY_HEADER = "X-Gpuaas-Delivery"


@dataclass(frozen=True)
class Answer:
    """How one POST went: `ok` (2xx), or whether trying again may help (`transient`: network, 408, 429, 5xx)."""

    ok: bool
    transient: bool
    status: int | None
    error: str


def sign(secret: str, timestamp: int, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    """What a receiver does (and the tests): recompute and compare in constant time."""
    try:
        expected = sign(secret, int(timestamp), body)
    except ValueError:
        return False
    return hmac.compare_digest(expected, signature)


def encode(payload: dict) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()


def post(url: str, payload: dict, *, secret: str, event: str, delivery: str, timeout_s: float) -> Answer:
    """POST `payload` as signed JSON. Never raises for an HTTP or network failure: the Answer says what happened."""
    body = encode(payload)
    now = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpuaas-notifications",
        TIMESTAMP_HEADER: str(now),
        SIGNATURE_HEADER: sign(secret, now, body),
        EVENT_HEADER: event,
        DELIVERY_HEADER: delivery,
    }
    try:
        response = requests.post(url, data=body, headers=headers, timeout=timeout_s, allow_redirects=False)
    except requests.RequestException as exc:
        return Answer(False, True, None, f"{type(exc).__name__}: {exc}"[:500])
    status = response.status_code
    if 200 <= status < 300:
        return Answer(True, False, status, "")
    transient = status in (408, 425, 429) or status >= 500
    return Answer(False, transient, status, f"HTTP {status}: {response.text[:300]}")
