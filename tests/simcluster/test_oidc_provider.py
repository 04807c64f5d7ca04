"""The simulator's OpenID Connect provider speaks the protocol a real relying party checks."""

from __future__ import annotations

import base64
import hashlib
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
import requests

from simcluster.oidc import DEMO_CLIENT, OidcProvider


@pytest.fixture
def idp():
    provider = OidcProvider().start()
    yield provider
    provider.stop()


def _code(idp, *, challenge: str | None = None, prompt: str | None = None, session=None):
    params = {
        "response_type": "code",
        "client_id": DEMO_CLIENT.client_id,
        "redirect_uri": "http://127.0.0.1:8000/oidc/callback/",
        "state": "s1",
        "nonce": "n1",
        "scope": "openid email",
    }
    if challenge:
        params |= {"code_challenge": challenge, "code_challenge_method": "S256"}
    session = session or requests.Session()
    if prompt:
        answer = session.get(f"{idp.issuer}/authorize", params={**params, "prompt": prompt}, allow_redirects=False)
    else:
        answer = session.post(f"{idp.issuer}/authorize", data={**params, "username": "grace"}, allow_redirects=False)
    assert answer.status_code == 302
    return {k: v[0] for k, v in parse_qs(urlsplit(answer.headers["Location"]).query).items()}


def test_discovery_names_its_endpoints_and_the_id_token_verifies_against_the_jwks(idp):
    config = requests.get(f"{idp.issuer}/.well-known/openid-configuration").json()
    assert config["issuer"] == idp.issuer and config["id_token_signing_alg_values_supported"] == ["RS256"]
    verifier = "v" * 50
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = _code(idp, challenge=challenge)
    assert query["state"] == "s1"
    form = {"grant_type": "authorization_code", "code": query["code"], "code_verifier": verifier}
    form["redirect_uri"] = "http://127.0.0.1:8000/oidc/callback/"
    tokens = requests.post(config["token_endpoint"], data=form, auth=(DEMO_CLIENT.client_id, DEMO_CLIENT.secret)).json()
    key = jwt.PyJWKClient(config["jwks_uri"]).get_signing_key_from_jwt(tokens["id_token"])
    claims = jwt.decode(
        tokens["id_token"], key, algorithms=["RS256"], audience=DEMO_CLIENT.client_id, issuer=idp.issuer
    )
    assert (claims["preferred_username"], claims["nonce"], claims["groups"]) == ("grace", "n1", ["team-vision"])
    again = requests.post(config["token_endpoint"], data=form, auth=(DEMO_CLIENT.client_id, DEMO_CLIENT.secret))
    assert again.status_code == 400  # a code is used once
    userinfo = requests.get(config["userinfo_endpoint"], headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert userinfo.json()["groups"] == ["team-vision"]
    requests.put(f"{idp.issuer}/directory/grace", json={"groups": []}).raise_for_status()
    userinfo = requests.get(config["userinfo_endpoint"], headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert userinfo.json()["groups"] == []  # userinfo says what the directory says now


def test_a_wrong_pkce_verifier_or_client_secret_gets_no_tokens(idp):
    challenge = base64.urlsafe_b64encode(hashlib.sha256(b"right" * 10).digest()).rstrip(b"=").decode()
    form = {"grant_type": "authorization_code", "redirect_uri": "http://127.0.0.1:8000/oidc/callback/"}
    wrong = {**form, "code": _code(idp, challenge=challenge)["code"], "code_verifier": "wrong" * 10}
    assert (
        requests.post(f"{idp.issuer}/token", data=wrong, auth=(DEMO_CLIENT.client_id, DEMO_CLIENT.secret)).status_code
        == 400
    )
    assert requests.post(f"{idp.issuer}/token", data=form, auth=(DEMO_CLIENT.client_id, "nope")).status_code == 401


def test_prompt_none_answers_login_required_without_a_session_and_a_code_with_one(idp):
    assert _code(idp, prompt="none")["error"] == "login_required"
    session = requests.Session()
    _code(idp, session=session)  # signs in, setting the provider's session cookie
    assert "code" in _code(idp, prompt="none", session=session)


def test_an_unregistered_redirect_uri_is_refused_without_redirecting(idp):
    params = {"response_type": "code", "client_id": DEMO_CLIENT.client_id, "redirect_uri": "https://evil.example/cb"}
    answer = requests.get(f"{idp.issuer}/authorize", params=params, allow_redirects=False)
    assert answer.status_code == 400 and "Location" not in answer.headers
