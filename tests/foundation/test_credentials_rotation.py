"""CREDENTIALS_KEYS: the first key encrypts, all decrypt; `manage.py rotate-credentials` moves to the first."""

import io

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command

from capacity.models import Cluster

OLD, NEW, LOST = (Fernet.generate_key().decode() for _ in range(3))
KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters: []\n"


def stored(settings, name, key):
    settings.CREDENTIALS_KEYS = [key]
    cluster = Cluster(name=name)
    cluster.set_kubeconfig(KUBECONFIG + f"# {name}\n")
    cluster.save()
    return cluster


def rotate() -> str:
    out = io.StringIO()
    call_command("rotate-credentials", stdout=out)
    return out.getvalue().strip()


@pytest.mark.django_db
def test_rotation_moves_every_credential_to_the_first_key_then_the_old_key_can_go(settings):
    a, b = stored(settings, "a", OLD), stored(settings, "b", OLD)
    untouched = Cluster.objects.create(name="path-only", kubeconfig_path="/etc/kube/config")
    settings.CREDENTIALS_KEYS = [NEW, OLD]
    assert rotate() == "2 stored credential(s) re-encrypted with the first key, 0 already were"

    settings.CREDENTIALS_KEYS = [NEW]  # the old key removed: everything still decrypts
    assert Cluster.objects.get(pk=a.pk).kubeconfig_text() == KUBECONFIG + "# a\n"
    assert Cluster.objects.get(pk=b.pk).kubeconfig_text() == KUBECONFIG + "# b\n"
    assert Cluster.objects.get(pk=untouched.pk).encrypted_kubeconfig == ""
    with pytest.raises(Exception):  # noqa: B017 - any failure: the old key alone no longer opens them
        Fernet(OLD).decrypt(Cluster.objects.get(pk=a.pk).encrypted_kubeconfig.encode())


@pytest.mark.django_db
def test_rotation_is_idempotent(settings):
    a = stored(settings, "a", OLD)
    settings.CREDENTIALS_KEYS = [NEW, OLD]
    rotate()
    token = Cluster.objects.get(pk=a.pk).encrypted_kubeconfig
    assert rotate() == "0 stored credential(s) re-encrypted with the first key, 1 already were"
    assert Cluster.objects.get(pk=a.pk).encrypted_kubeconfig == token


@pytest.mark.django_db
def test_new_credentials_are_encrypted_with_the_first_key(settings):
    settings.CREDENTIALS_KEYS = [NEW, OLD]
    cluster = Cluster(name="a")
    cluster.set_kubeconfig(KUBECONFIG)
    assert Fernet(NEW).decrypt(cluster.encrypted_kubeconfig.encode()).decode() == KUBECONFIG


@pytest.mark.django_db
def test_undecryptable_credential_stops_rotation_and_nothing_is_written(settings):
    good, lost = stored(settings, "good", OLD), stored(settings, "lost", LOST)
    before = dict(Cluster.objects.values_list("name", "encrypted_kubeconfig"))
    settings.CREDENTIALS_KEYS = [NEW, OLD]
    with pytest.raises(CommandError) as excinfo:
        rotate()
    assert str(excinfo.value) == (
        "the stored kubeconfig of lost cannot be decrypted with any of CREDENTIALS_KEYS: add the key it was"
        " encrypted with (after the first) and run again; nothing was changed"
    )
    assert dict(Cluster.objects.values_list("name", "encrypted_kubeconfig")) == before
    assert good.pk and lost.pk


@pytest.mark.django_db
def test_decrypt_names_the_setting_when_no_key_fits(settings):
    cluster = stored(settings, "a", OLD)
    settings.CREDENTIALS_KEYS = [NEW]
    with pytest.raises(ValueError, match="cannot be decrypted with any of CREDENTIALS_KEYS"):
        cluster.kubeconfig_text()
