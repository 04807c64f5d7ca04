"""The simulated identity provider (simcluster/oidc.py) started for a test, and gpuaas pointed at it."""

from __future__ import annotations

from contextlib import contextmanager

from django.test import override_settings

from simcluster.oidc import Client, OidcProvider, Person
from tenancy.oidc import provider as oidc_provider

CLIENT = Client("gpuaas-test", "gpuaas-test-secret", ("http://testserver/oidc/", "http://localhost:"))
PEOPLE = (
    Person("olivia", "Olivia (operator)", ["platform-ops"]),
    Person("mia", "Mia (team-a)", ["team-a-devs"]),
    Person("nobody", "No group", ["staff"]),
)


@contextmanager
def running_provider(**settings_overrides):
    provider = OidcProvider(people=PEOPLE, clients=[CLIENT]).start()
    overrides = {
        "OIDC_ISSUER": provider.issuer,
        "OIDC_RP_CLIENT_ID": CLIENT.client_id,
        "OIDC_RP_CLIENT_SECRET": CLIENT.secret,
        "OIDC_API_AUDIENCE": CLIENT.client_id,
        "OIDC_BEARER_CACHE_SECONDS": 0,
        "OIDC_PROVIDER_NAME": "Simulated IdP",
        **settings_overrides,
    }
    oidc_provider.forget()
    try:
        with override_settings(**overrides):
            yield provider
    finally:
        oidc_provider.forget()
        provider.stop()


def map_groups(project):
    """platform-ops -> operator; team-a-devs -> member of `project`."""
    from tenancy.models import IdentityGroupRole

    IdentityGroupRole.objects.create(group="platform-ops", operator=True)
    IdentityGroupRole.objects.create(group="team-a-devs", project=project, role="member")
