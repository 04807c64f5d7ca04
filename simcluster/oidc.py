"""A small OpenID Connect provider for the simulator's world: the demo's and the tests' company sign-in.

It speaks the real protocol that gpuaas's relying party (mozilla-django-oidc) uses against Keycloak,
Entra ID, Okta or Dex: discovery (`/.well-known/openid-configuration`, OpenID Connect Discovery 1.0),
the authorization-code flow (`/authorize` with a login form where the demo picks a person, and
`prompt=none` for silent renewal), `/token` (client_secret_basic or client_secret_post), `/userinfo`
and `/jwks`. ID and access tokens are JWTs signed RS256 with PyJWT (a maintained JOSE library) and a
key generated at start. The directory is in memory: `set_groups()` (or `PUT /directory/<username>`
with `{"groups": [...]}`) changes a person's groups, which is how tests and the demo offboard someone.

Written here rather than run as Keycloak or Dex because the simulator needs no container runtime and
starts in milliseconds; it is a test double, never a production identity provider (no consent, no
passwords: whoever reaches the form picks a person).
"""

from __future__ import annotations

import hashlib
import html
import json
import secrets
import threading
import time
import uuid
from base64 import b64decode, urlsafe_b64encode
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
SESSION_COOKIE = "simoidc_session"


@dataclass
class Person:
    username: str
    name: str
    groups: list[str] = field(default_factory=list)

    @property
    def sub(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"simcluster-oidc:{self.username}"))

    @property
    def email(self) -> str:
        return f"{self.username}@example.com"


@dataclass
class Client:
    client_id: str
    secret: str
    # Redirect URIs must start with one of these; empty: any http(s) URL on a loopback host (the demo).
    redirect_prefixes: tuple[str, ...] = ()

    def allows(self, redirect_uri: str) -> bool:
        if self.redirect_prefixes:
            return any(redirect_uri.startswith(prefix) for prefix in self.redirect_prefixes)
        parts = urlsplit(redirect_uri)
        return parts.scheme in ("http", "https") and parts.hostname in LOOPBACK_HOSTS


# The demo's directory (docs/demo.md): its operator, a member of the vision team, and someone with no
# gpuaas group. gpuaas maps the groups (tenancy.IdentityGroupRole rows the demo seeds).
DEMO_CLIENT = Client("gpuaas-demo", "gpuaas-demo-secret")
DEMO_PEOPLE = (
    Person("ada", "Ada (operator)", ["gpuaas-operators"]),
    Person("grace", "Grace (vision team)", ["team-vision"]),
    Person("linus", "Linus (no gpuaas group)", ["everyone"]),
)


class OidcProvider:
    """The provider: start(), then `issuer` is its URL; stop() when done. Thread-safe directory."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        people: tuple[Person, ...] | list[Person] = DEMO_PEOPLE,
        clients: tuple[Client, ...] | list[Client] = (DEMO_CLIENT,),
        token_lifetime_s: int = 300,
    ):
        self.host, self.port = host, port
        self.people = {p.username: Person(p.username, p.name, list(p.groups)) for p in people}
        self.clients = {c.client_id: c for c in clients}
        self.token_lifetime_s = token_lifetime_s
        self.lock = threading.Lock()
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(8)
        self.codes: dict[str, dict] = {}
        self.sessions: dict[str, str] = {}  # browser session id -> username
        self.revoked: set[str] = set()  # access-token ids
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    @property
    def issuer(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> OidcProvider:
        self._server = ThreadingHTTPServer((self.host, self.port), _handler_for(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="simcluster-oidc", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- directory ----------------------------------------------------------------------------
    def set_groups(self, username: str, groups: list[str]) -> None:
        with self.lock:
            self.people[username].groups = list(groups)

    def claims_of(self, username: str) -> dict:
        with self.lock:
            person = self.people[username]
            return {
                "sub": person.sub,
                "preferred_username": person.username,
                "name": person.name,
                "email": person.email,
                "email_verified": True,
                "groups": list(person.groups),
            }

    # --- documents ----------------------------------------------------------------------------
    def configuration(self) -> dict:
        base = self.issuer
        return {
            "issuer": base,
            "authorization_endpoint": f"{base}/authorize",
            "token_endpoint": f"{base}/token",
            "userinfo_endpoint": f"{base}/userinfo",
            "jwks_uri": f"{base}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": ["openid", "email", "profile", "groups"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "nonce", "preferred_username", "email", "groups"],
            "grant_types_supported": ["authorization_code"],
            "code_challenge_methods_supported": ["S256"],
        }

    def jwks(self) -> dict:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def _sign(self, claims: dict) -> str:
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})

    # --- the flow ----------------------------------------------------------------------------
    def issue_code(
        self,
        *,
        client_id: str,
        redirect_uri: str,
        username: str,
        nonce: str | None,
        scope: str,
        code_challenge: str | None = None,
    ) -> str:
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.codes[code] = {
                "client_id": client_id,
                "redirect_uri": redirect_uri,
                "username": username,
                "nonce": nonce,
                "scope": scope,
                "code_challenge": code_challenge,
                "expires": time.time() + 60,
            }
        return code

    def exchange(self, *, code: str, client: Client, redirect_uri: str, code_verifier: str = "") -> dict | None:
        """Tokens for a code (single use), or None when the code is unknown, expired, not this client's, or
        its PKCE verifier (RFC 7636, S256) does not match the challenge sent with it."""
        with self.lock:
            grant = self.codes.pop(code, None)
        if grant is None or grant["expires"] < time.time():
            return None
        if grant["client_id"] != client.client_id or grant["redirect_uri"] != redirect_uri:
            return None
        if grant["code_challenge"]:
            digest = hashlib.sha256(code_verifier.encode()).digest()
            if urlsafe_b64encode(digest).rstrip(b"=").decode() != grant["code_challenge"]:
                return None
        return self.tokens_for(grant["username"], client.client_id, nonce=grant["nonce"], scope=grant["scope"])

    def tokens_for(self, username: str, client_id: str, *, nonce: str | None = None, scope: str = "openid") -> dict:
        """An ID token and an access token for `username`, as /token answers (tests mint bearer tokens here)."""
        now = int(time.time())
        claims = self.claims_of(username)
        common = {"iss": self.issuer, "sub": claims["sub"], "aud": client_id, "azp": client_id, "iat": now}
        exp = now + self.token_lifetime_s
        id_token = self._sign({**common, **claims, "exp": exp, "auth_time": now, **({"nonce": nonce} if nonce else {})})
        access_token = self._sign({**common, "exp": exp, "jti": secrets.token_hex(12), "scope": scope})
        return {
            "access_token": access_token,
            "id_token": id_token,
            "token_type": "Bearer",
            "expires_in": self.token_lifetime_s,
            "scope": scope,
        }

    def revoke(self, access_token: str) -> None:
        with self.lock:
            self.revoked.add(jwt.decode(access_token, options={"verify_signature": False})["jti"])

    def userinfo(self, access_token: str) -> dict | None:
        """The person's current claims (groups as they are now), or None for a bad/expired/revoked token."""
        try:
            payload = jwt.decode(
                access_token,
                self.key.public_key(),
                algorithms=["RS256"],
                issuer=self.issuer,
                options={"verify_aud": False},
            )
        except jwt.PyJWTError:
            return None
        with self.lock:
            if payload.get("jti") in self.revoked:
                return None
            username = next((p.username for p in self.people.values() if p.sub == payload["sub"]), None)
        return None if username is None else self.claims_of(username)


def _handler_for(provider: OidcProvider):
    class Handler(_Handler):
        pass

    Handler.provider = provider
    return Handler


class _Handler(BaseHTTPRequestHandler):
    provider: OidcProvider
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet, as the API server is without --verbose
        return

    # --- plumbing ------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: dict, headers: dict | None = None) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", headers)

    def _html(self, status: int, text: str, headers: dict | None = None) -> None:
        head = "<title>Simulated sign-in</title><link rel='icon' href='data:,'>"
        page = f"<!doctype html><html><head>{head}</head><body>{text}</body></html>"
        self._send(status, page.encode(), "text/html; charset=utf-8", headers)

    def _redirect(self, location: str, headers: dict | None = None) -> None:
        self._send(302, b"", "text/plain", {"Location": location, **(headers or {})})

    def _form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode() if length else ""
        return {k: v[0] for k, v in parse_qs(raw).items()}

    def _session_user(self) -> str | None:
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == SESSION_COOKIE:
                return self.provider.sessions.get(value)
        return None

    # --- routes --------------------------------------------------------------------------------
    def do_GET(self):
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        if parts.path == "/.well-known/openid-configuration":
            return self._json(200, self.provider.configuration())
        if parts.path == "/jwks":
            return self._json(200, self.provider.jwks())
        if parts.path == "/authorize":
            return self._authorize(query, chosen=None)
        if parts.path == "/userinfo":
            return self._userinfo()
        if parts.path == "/directory":
            return self._json(200, {"people": [self.provider.claims_of(name) for name in sorted(self.provider.people)]})
        return self._json(404, {"error": "not_found"})

    def do_POST(self):
        path = urlsplit(self.path).path
        form = self._form()
        if path == "/authorize":
            return self._authorize(form, chosen=form.get("username"))
        if path == "/token":
            return self._token(form)
        return self._json(404, {"error": "not_found"})

    def do_PUT(self):
        path = urlsplit(self.path).path
        if not path.startswith("/directory/"):
            return self._json(404, {"error": "not_found"})
        username = path.removeprefix("/directory/")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            groups = json.loads(self.rfile.read(length) or b"{}")["groups"]
            assert isinstance(groups, list) and all(isinstance(g, str) for g in groups)
        except (ValueError, KeyError, AssertionError):
            return self._json(400, {"error": 'give {"groups": ["name", ...]}'})
        if username not in self.provider.people:
            return self._json(404, {"error": f"no person {username!r}"})
        self.provider.set_groups(username, groups)
        return self._json(200, self.provider.claims_of(username))

    def _authorize(self, params: dict, *, chosen: str | None):
        client = self.provider.clients.get(params.get("client_id", ""))
        redirect_uri = params.get("redirect_uri", "")
        if client is None or not client.allows(redirect_uri):
            # Never redirect to an unregistered URI: answer here (RFC 6749 section 4.1.2.1).
            return self._html(400, "<h1>Unknown client or redirect URI</h1>")
        state = params.get("state", "")
        if params.get("response_type") != "code":
            return self._redirect(f"{redirect_uri}?{urlencode({'error': 'unsupported_response_type', 'state': state})}")
        username = chosen or self._session_user()
        headers = {}
        if chosen:
            if chosen not in self.provider.people:
                return self._html(400, "<h1>No such person</h1>")
            sid = secrets.token_urlsafe(16)
            self.provider.sessions[sid] = chosen
            headers["Set-Cookie"] = f"{SESSION_COOKIE}={sid}; Path=/; HttpOnly; SameSite=Lax"
        if username is None:
            if params.get("prompt") == "none":
                return self._redirect(f"{redirect_uri}?{urlencode({'error': 'login_required', 'state': state})}")
            return self._login_form(params)
        code = self.provider.issue_code(
            client_id=client.client_id,
            redirect_uri=redirect_uri,
            username=username,
            nonce=params.get("nonce"),
            scope=params.get("scope", "openid"),
            code_challenge=params.get("code_challenge"),
        )
        return self._redirect(f"{redirect_uri}?{urlencode({'code': code, 'state': state})}", headers)

    def _login_form(self, params: dict):
        hidden = "".join(
            f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
            for k, v in params.items()
            if k != "username"
        )
        buttons = "".join(
            f'<button type="submit" name="username" value="{html.escape(p.username)}">{html.escape(p.name)}'
            f" — groups: {html.escape(', '.join(p.groups) or 'none')}</button><br>"
            for p in self.provider.people.values()
        )
        self._html(
            200, f'<h1>Simulated identity provider</h1><p>Sign in as:</p><form method="post">{hidden}{buttons}</form>'
        )

    def _client(self, form: dict) -> Client | None:
        client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        header = self.headers.get("Authorization", "")
        if header.lower().startswith("basic "):
            try:
                client_id, _, secret = b64decode(header[6:]).decode().partition(":")
            except ValueError:
                return None
        client = self.provider.clients.get(client_id)
        return client if client is not None and secrets.compare_digest(client.secret, secret) else None

    def _token(self, form: dict):
        client = self._client(form)
        if client is None:
            return self._json(401, {"error": "invalid_client"}, {"WWW-Authenticate": "Basic"})
        if form.get("grant_type") != "authorization_code":
            return self._json(400, {"error": "unsupported_grant_type"})
        tokens = self.provider.exchange(
            code=form.get("code", ""),
            client=client,
            redirect_uri=form.get("redirect_uri", ""),
            code_verifier=form.get("code_verifier", ""),
        )
        if tokens is None:
            return self._json(400, {"error": "invalid_grant"})
        return self._json(200, tokens)

    def _userinfo(self):
        header = self.headers.get("Authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        claims = self.provider.userinfo(token) if token else None
        if claims is None:
            return self._json(
                401,
                {"error": "invalid_token"},
                {"WWW-Authenticate": 'Bearer error="invalid_token", error_description="The access token is invalid"'},
            )
        return self._json(200, claims)
