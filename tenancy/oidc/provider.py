"""The identity provider, as gpuaas sees it: the one module that talks to it over HTTP.

Its endpoints come from OpenID Connect Discovery (`OIDC_ISSUER` + `/.well-known/openid-configuration`),
read when first needed and kept OIDC_DISCOVERY_CACHE_S in this process, so a provider that is down
at start-up stops no process: the sign-in page says so instead (ProviderUnavailable). Signing keys
come from its JWKS (refetched once when a token names a key not seen yet: the provider rotated).
Tokens are checked with PyJWT: signature, `iss`, `aud` (or `azp`), `exp`; mozilla-django-oidc's own
check leaves audience and issuer unchecked, so gpuaas's backend uses these instead.
"""

from __future__ import annotations

import threading
import time

import jwt
import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation

REQUIRED = ("issuer", "authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
_lock = threading.Lock()
_documents: dict[str, tuple[float, dict]] = {}  # url -> (good until, document)


class ProviderUnavailable(Exception):
    """The provider could not be reached, or answered something that is not OpenID Connect.

    The message names the URL and what to check; views answer it with a 503 page, the API with a 503.
    """


def issuer() -> str:
    return settings.OIDC_ISSUER.rstrip("/")


def forget() -> None:
    """Drop the cached discovery document and keys (tests; a provider that moved)."""
    with _lock:
        _documents.clear()


def _get_json(url: str, what: str, *, refresh: bool = False) -> dict:
    now = time.monotonic()
    with _lock:
        cached = _documents.get(url)
    if cached and cached[0] > now and not refresh:
        return cached[1]
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        document = response.json()
    except requests.RequestException as exc:
        raise ProviderUnavailable(
            f"the identity provider's {what} at {url} could not be read ({exc.__class__.__name__}); "
            "check OIDC_ISSUER and that the provider is up"
        ) from exc
    except ValueError as exc:
        raise ProviderUnavailable(f"the identity provider's {what} at {url} is not JSON; check OIDC_ISSUER") from exc
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"the identity provider's {what} at {url} is not a JSON object; check OIDC_ISSUER")
    with _lock:
        _documents[url] = (now + settings.OIDC_DISCOVERY_CACHE_S, document)
    return document


def configuration() -> dict:
    """The provider's discovery document, checked for what gpuaas needs and for naming OIDC_ISSUER."""
    url = f"{issuer()}/.well-known/openid-configuration"
    document = _get_json(url, "discovery document")
    missing = [key for key in REQUIRED if not document.get(key)]
    if missing:
        raise ProviderUnavailable(f"the discovery document at {url} lacks {', '.join(missing)}; check OIDC_ISSUER")
    if str(document["issuer"]).rstrip("/") != issuer():
        raise ProviderUnavailable(
            f"the discovery document at {url} names the issuer {document['issuer']!r}, "
            f"not OIDC_ISSUER={settings.OIDC_ISSUER!r}: set OIDC_ISSUER to the provider's issuer exactly"
        )
    return document


def endpoint(name: str) -> str:
    return configuration()[name]


def signing_key(token: str) -> jwt.PyJWK:
    """The provider's key that signed `token` (by `kid`), refetching the JWKS once for a new kid."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise SuspiciousOperation("The token is not a JWT.") from exc
    algorithm = settings.OIDC_RP_SIGN_ALGO
    if header.get("alg") != algorithm:
        raise SuspiciousOperation(f"The token is signed {header.get('alg')!r}, not {algorithm} (OIDC_SIGN_ALGO).")
    for refresh in (False, True):
        keys = _get_json(endpoint("jwks_uri"), "JWKS", refresh=refresh).get("keys", [])
        for key in keys:
            if key.get("kid") == header.get("kid") and key.get("alg", algorithm) == algorithm:
                return jwt.PyJWK(key, algorithm=algorithm)
    raise SuspiciousOperation("No key of the provider's JWKS signed this token.")


def verify(token: str, *, audience: str, allow_azp: bool = False) -> dict:
    """The claims of a JWT the provider signed for `audience`; SuspiciousOperation for anything else.

    `allow_azp`: an access token may name gpuaas as its authorised party (`azp`, Keycloak) instead of
    its audience (`aud`, Entra ID, Okta's custom authorisation servers).
    """
    key = signing_key(token)
    try:
        claims = jwt.decode(
            token,
            key,
            algorithms=[settings.OIDC_RP_SIGN_ALGO],
            issuer=configuration()["issuer"],
            options={"verify_aud": False, "require": ["exp", "iss", "sub"]},
            leeway=settings.OIDC_CLOCK_SKEW_S,
        )
    except jwt.PyJWTError as exc:
        raise SuspiciousOperation(f"The token was refused: {exc}.") from exc
    audiences = claims.get("aud", [])
    audiences = [audiences] if isinstance(audiences, str) else list(audiences)
    if audience not in audiences and not (allow_azp and claims.get("azp") == audience):
        raise SuspiciousOperation(f"The token is not meant for gpuaas (audience {audience!r}).")
    return claims


def userinfo(access_token: str) -> dict | None:
    """The provider's current claims for `access_token` (groups as they are now); None if it refuses it."""
    url = endpoint("userinfo_endpoint")
    try:
        response = requests.get(url, headers={"Authorization": f"Bearer {access_token}"}, timeout=settings.OIDC_TIMEOUT)
    except requests.RequestException as exc:
        raise ProviderUnavailable(f"the identity provider's userinfo at {url} could not be reached") from exc
    if response.status_code in (400, 401, 403):
        return None
    try:
        response.raise_for_status()
        claims = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"the identity provider's userinfo at {url} answered {response.status_code}") from exc
    return claims if isinstance(claims, dict) else None
