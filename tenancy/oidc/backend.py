"""Django authentication backends: sign-in through the identity provider, and local passwords.

OidcBackend is mozilla-django-oidc's backend with three changes: endpoints and keys come from
discovery (tenancy.oidc.provider), ID tokens are checked for issuer and audience as well as
signature and nonce, and users are found by the provider's subject (tenancy.ExternalIdentity), never
by e-mail, and given exactly the roles their groups map to at every sign-in
(tenancy.roles.apply_identity_groups). It grants no permissions itself: LocalPasswordBackend (Django's
ModelBackend) answers permission checks for every user, whatever LOCAL_PASSWORDS says.
"""

from __future__ import annotations

import hashlib
import logging
import re

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from .. import roles
from ..models import ExternalIdentity
from . import enabled, local_passwords, provider

logger = logging.getLogger(__name__)


class LocalPasswordBackend(ModelBackend):
    """Django's username-and-password sign-in, refused when LOCAL_PASSWORDS=0; permissions for all users."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not local_passwords():
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def groups_of(claims: dict) -> list[str]:
    """The groups claim (OIDC_GROUPS_CLAIM) as a list of names; a single string is one group."""
    value = claims.get(settings.OIDC_GROUPS_CLAIM) or []
    if isinstance(value, str):
        value = [value]
    return sorted({str(group) for group in value if isinstance(group, str | int)})


def _username(claims: dict) -> str:
    """A free username from preferred_username (else the e-mail's local part, else the subject)."""
    wanted = claims.get("preferred_username") or (claims.get("email") or "").split("@")[0] or claims["sub"]
    base = re.sub(r"[^\w.@+-]", "-", str(wanted))[:120] or "user"
    User = get_user_model()
    if not User.objects.filter(username=base).exists():
        return base
    return f"{base}-{hashlib.sha256(claims['sub'].encode()).hexdigest()[:8]}"


@transaction.atomic
def sign_in_external(claims: dict) -> tuple[object | None, str | None]:
    """The user the provider's `claims` name, with roles re-applied from their groups; (user, refusal).

    Found by (issuer, sub); created (no usable password) only when their groups give some access.
    When the groups give nothing, an existing user is stripped of every role and refused: (None, why).
    """
    issuer, subject = provider.issuer(), str(claims["sub"])
    groups = groups_of(claims)
    identity = (
        ExternalIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=issuer, subject=subject)
        .first()
    )
    User = get_user_model()
    if identity is None:
        if not roles.mapped_groups_exist(groups):
            return None, _no_group(claims)
        user = User(username=_username(claims), email=claims.get("email") or "")
        user.set_unusable_password()
        user.save()
        identity = ExternalIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    user = identity.user
    has_access = roles.apply_identity_groups(user, groups)
    ExternalIdentity.objects.filter(pk=identity.pk).update(groups=groups, last_seen_at=timezone.now())
    if claims.get("email") and user.email != claims["email"]:
        user.email = claims["email"]
        user.save(update_fields=["email"])
    if not has_access:
        return None, _no_group(claims)
    return user, None


def _no_group(claims: dict) -> str:
    who = claims.get("preferred_username") or claims.get("email") or claims.get("sub")
    return (
        f"{who} is in no group that gpuaas maps to a role (claim {settings.OIDC_GROUPS_CLAIM!r}); "
        "ask an operator to map your group, or your administrator to add you to one."
    )


class OidcBackend(OIDCAuthenticationBackend):
    """Sign-in with the authorization-code flow (the callback view passes the nonce it stored)."""

    def __init__(self, *args, **kwargs):
        # mozilla-django-oidc reads every endpoint here; these come from discovery when first used.
        self.UserModel = get_user_model()
        self.refusal: str | None = None

    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: provider.endpoint("token_endpoint"))
    OIDC_OP_USER_ENDPOINT = property(lambda self: provider.endpoint("userinfo_endpoint"))
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: provider.endpoint("jwks_uri"))
    OIDC_RP_CLIENT_ID = property(lambda self: settings.OIDC_RP_CLIENT_ID)
    OIDC_RP_CLIENT_SECRET = property(lambda self: settings.OIDC_RP_CLIENT_SECRET)
    OIDC_RP_SIGN_ALGO = property(lambda self: settings.OIDC_RP_SIGN_ALGO)
    OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request, **kwargs):
        # Only the callback passes `nonce`: a password form posted with ?code=... never reaches the provider.
        if not enabled() or request is None or "nonce" not in kwargs:
            return None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token, **kwargs):
        claims = provider.verify(token, audience=settings.OIDC_RP_CLIENT_ID)
        if settings.OIDC_USE_NONCE and claims.get("nonce") != kwargs.get("nonce"):
            raise SuspiciousOperation("The ID token's nonce is not the one this sign-in sent.")
        return claims

    def get_userinfo(self, access_token, id_token, payload):
        claims = provider.userinfo(access_token)
        if claims is None:
            raise SuspiciousOperation("The identity provider refused the access token at its userinfo endpoint.")
        return claims

    def get_or_create_user(self, access_token, id_token, payload):
        """Claims = the token's (ID token at sign-in, access token for the API) overlaid with userinfo's.

        Userinfo is asked every time: it is the provider's word on the person's groups now. Where
        userinfo has no groups claim, the token's is used (Entra ID emits groups as an optional claim
        of its ID and access tokens, configured per app registration).
        """
        userinfo = self.get_userinfo(access_token, id_token, payload)
        claims = {**(payload or {}), **userinfo}
        if not claims.get("sub") or (payload and payload.get("sub") != userinfo.get("sub")):
            raise SuspiciousOperation("The userinfo subject is not the token's subject.")
        if settings.OIDC_GROUPS_CLAIM not in userinfo and payload and settings.OIDC_GROUPS_CLAIM in payload:
            claims[settings.OIDC_GROUPS_CLAIM] = payload[settings.OIDC_GROUPS_CLAIM]
        user, self.refusal = sign_in_external(claims)
        if self.refusal and getattr(self, "request", None) is not None:
            self.request.oidc_refusal = self.refusal
        return user

    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    # Permissions are LocalPasswordBackend's (ModelBackend) for every user: none are granted here.
    def get_user_permissions(self, user_obj, obj=None):
        return set()

    def get_group_permissions(self, user_obj, obj=None):
        return set()

    def get_all_permissions(self, user_obj, obj=None):
        return set()

    def has_perm(self, user_obj, perm, obj=None):
        return False

    def has_module_perms(self, user_obj, app_label):
        return False

    def with_perm(self, perm, is_active=True, include_superusers=True, obj=None):
        return get_user_model().objects.none()
