"""Onboarding a cluster from the console: deploy/'s node agent, RBAC and admission policies by server-side apply.

Against the simulator (which does server-side apply as kube-apiserver does: tests/simcluster/
test_sim_server_side_apply.py): the dry run shows the diff and writes nothing; the apply is recorded and
idempotent; a field another manager owns is a conflict unless forced; the cluster's errors are clear and leave
nothing half-recorded; only operators may do it.
"""

from __future__ import annotations

import json

import pytest
import yaml
from rest_framework.test import APIClient

from capacity.adapters import kubernetes as kube
from capacity.models import ClusterOnboarding
from capacity.services import onboarding

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


@pytest.fixture
def sim(simcluster):
    handle = simcluster("demo")
    handle.register("prod")
    return handle


@pytest.fixture
def cluster(sim):
    return sim.clusters["prod"]


def stored(sim, plural: str, key):
    record = getattr(sim.state.clusters["prod"], plural).get(key)
    return None if record is None else record.obj


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def expected_objects() -> list[tuple[str, str]]:
    """(kind, name) of every object onboarding applies, read from deploy/ here too."""
    out = []
    for filename, names in onboarding.ONBOARD_MANIFESTS:
        for doc in yaml.safe_load_all((onboarding.DEPLOY_DIR / filename).read_text()):
            if doc and (names is None or doc["metadata"]["name"] in names):
                out.append((doc["kind"], doc["metadata"]["name"]))
    return out


def test_the_objects_are_deploys_own_manifests(cluster):
    objects = onboarding.onboarding_objects(cluster)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == expected_objects()
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "ValidatingAdmissionPolicy"} <= kinds
    config = next(o for o in objects if o["metadata"]["name"] == onboarding.AGENT_CONFIG)
    assert config["data"]["AGENT_CLUSTER_NAME"] == cluster.name
    kustomization = yaml.safe_load((onboarding.DEPLOY_DIR / "kustomization.yaml").read_text())
    image = kustomization["images"][0]
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == f"{image['newName']}:{image['newTag']}"


def test_dry_run_shows_every_object_as_a_create_and_writes_nothing(sim, cluster):
    changes = onboarding.plan_onboarding(cluster)
    assert [(c.kind, c.name) for c in changes] == expected_objects()
    assert {c.action for c in changes} == {"create"}
    daemonset = next(c for c in changes if c.kind == "DaemonSet")
    assert "spec.template.spec.serviceAccountName" in {f.path for f in daemonset.fields}
    assert stored(sim, "daemonsets", ("gpuaas-agent", "gpuaas-node-agent")) is None
    assert "gpuaas-agent" not in sim.state.clusters["prod"].namespaces
    assert not ClusterOnboarding.objects.exists()


def test_apply_installs_everything_as_gpuaas_and_a_second_apply_changes_nothing(sim, cluster, operator):
    row = onboarding.onboard_cluster(cluster, actor=operator)
    assert row.status == "applied" and row.actor == operator and row.error == ""
    assert row.counts() == {"create": len(expected_objects()), "change": 0, "unchanged": 0}
    daemonset = stored(sim, "daemonsets", ("gpuaas-agent", "gpuaas-node-agent"))
    assert [e["manager"] for e in daemonset["metadata"]["managedFields"]] == ["gpuaas"]
    assert stored(sim, "configmaps", ("gpuaas-agent", "gpuaas-agent-config"))["data"]["AGENT_CLUSTER_NAME"] == "prod"
    assert stored(sim, "validatingadmissionpolicies", "gpuaas-dra-claims") is not None
    rv = sim.state.clusters["prod"].rv

    again = onboarding.onboard_cluster(cluster, actor=operator)
    assert again.counts() == {"create": 0, "change": 0, "unchanged": len(expected_objects())}
    assert sim.state.clusters["prod"].rv == rv  # nothing written in the cluster
    assert {c.action for c in onboarding.plan_onboarding(cluster)} == {"unchanged"}
    assert ClusterOnboarding.objects.filter(cluster=cluster).count() == 2


def hand_edit_image(sim, image: str) -> None:
    """What `kubectl edit` does: an update by another field manager."""
    with sim.state.lock:
        api = sim.state.clusters["prod"]
        from simcluster import kube as simkube

        simkube.ClusterApi(api, manager="kubectl-edit").patch(
            "daemonsets",
            "gpuaas-agent",
            "gpuaas-node-agent",
            {"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": image}]}}}},
            "application/merge-patch+json",
        )


def test_a_field_another_manager_changed_is_a_conflict_until_forced(sim, cluster, operator):
    onboarding.onboard_cluster(cluster, actor=operator)
    hand_edit_image(sim, "mine:1")

    with pytest.raises(onboarding.OnboardingError) as exc:
        onboarding.plan_onboarding(cluster)
    assert exc.value.status == 409
    message = str(exc.value)
    assert message.startswith("DaemonSet gpuaas-agent/gpuaas-node-agent: apply DaemonSet on ")
    assert message.endswith(
        '409 Conflict: Apply failed with 1 conflict: conflict with "kubectl-edit" using apps/v1: '
        ".spec.template.spec.containers"
    )
    with pytest.raises(onboarding.OnboardingError):
        onboarding.onboard_cluster(cluster, actor=operator)
    assert ClusterOnboarding.objects.count() == 1  # the refused apply wrote nothing, here or there
    assert stored(sim, "daemonsets", ("gpuaas-agent", "gpuaas-node-agent"))["spec"]["template"]["spec"][
        "containers"
    ] == [{"name": "agent", "image": "mine:1"}]

    changes = onboarding.plan_onboarding(cluster, force=True)
    changed = [c for c in changes if c.action == "change"]
    assert [(c.kind, [f.path for f in c.fields]) for c in changed] == [("DaemonSet", ["spec.template.spec.containers"])]
    assert changed[0].fields[0].before == [{"name": "agent", "image": "mine:1"}]
    row = onboarding.onboard_cluster(cluster, actor=operator, force=True)
    assert row.force and row.counts()["change"] == 1
    image = stored(sim, "daemonsets", ("gpuaas-agent", "gpuaas-node-agent"))["spec"]["template"]["spec"]
    assert image["containers"][0]["image"] != "mine:1"


def test_an_unreachable_cluster_is_a_clear_error_and_records_nothing(sim, cluster, operator):
    sim.server.stop()
    with pytest.raises(onboarding.OnboardingError) as exc:
        onboarding.onboard_cluster(cluster, actor=operator)
    assert str(exc.value).startswith("Namespace gpuaas: ")
    assert "connection failed" in str(exc.value)
    assert not ClusterOnboarding.objects.exists()


def test_a_failure_half_way_records_what_the_cluster_took_and_the_error(sim, cluster, operator):
    client = kube.KubernetesClient.for_cluster(cluster)
    real = client.apply_object

    def flaky(obj, *, force=False, dry_run=False):
        if obj["kind"] == "DaemonSet" and not dry_run:
            raise kube.Unavailable("apply DaemonSet: 503 ServiceUnavailable: the cluster went away", status=503)
        return real(obj, force=force, dry_run=dry_run)

    client.apply_object = flaky
    with pytest.raises(onboarding.OnboardingError) as exc:
        onboarding.onboard_cluster(cluster, actor=operator, client=client)
    assert "DaemonSet gpuaas-agent/gpuaas-node-agent: apply DaemonSet: 503" in str(exc.value)
    row = ClusterOnboarding.objects.get()
    assert row.status == "failed" and row.error == str(exc.value)
    names = [o["name"] for o in row.objects_applied]
    assert names == [name for kind, name in expected_objects()][: len(names)]
    assert "gpuaas-node-agent" not in [o["name"] for o in row.objects_applied if o["kind"] == "DaemonSet"]
    # Running it again finishes the job.
    assert onboarding.onboard_cluster(cluster, actor=operator).counts()["create"] > 0


# --- API -------------------------------------------------------------------------------------------


def test_api_dry_run_then_apply(sim, cluster, operator):
    client = api(operator)
    url = f"/api/v1/capacity/clusters/{cluster.pk}/onboard/"
    dry = client.post(f"{url}?dry_run=1")
    assert dry.status_code == 200, dry.content
    body = dry.json()
    assert body["dry_run"] is True and body["onboarding"] is None
    assert [o["action"] for o in body["objects"]] == ["create"] * len(expected_objects())
    assert not ClusterOnboarding.objects.exists()

    applied = client.post(url)
    assert applied.status_code == 200
    assert applied.json()["onboarding"] == ClusterOnboarding.objects.get().pk
    again = client.post(url).json()
    assert {o["action"] for o in again["objects"]} == {"unchanged"}
    detail = client.get(f"/api/v1/capacity/clusters/{cluster.pk}/").json()
    assert detail["last_onboarding"]["status"] == "applied"
    assert detail["last_onboarding"]["actor"] == operator.username


def test_api_conflict_is_409_and_an_unreachable_cluster_502(sim, cluster, operator):
    client = api(operator)
    url = f"/api/v1/capacity/clusters/{cluster.pk}/onboard/"
    client.post(url)
    hand_edit_image(sim, "mine:1")
    conflict = client.post(f"{url}?dry_run=1")
    assert conflict.status_code == 409
    assert "kubectl-edit" in conflict.json()["detail"]
    assert client.post(f"{url}?dry_run=1&force=1").status_code == 200
    sim.server.stop()
    down = client.post(url)
    assert down.status_code == 502
    assert down.json()["detail"].startswith("Namespace gpuaas: ")
    assert ClusterOnboarding.objects.count() == 1


def test_api_a_registration_without_usable_credentials_is_409(db, operator):
    from capacity.models import Cluster

    cluster = Cluster.objects.create(name="lost", kubeconfig_path="/nonexistent/kubeconfig")
    answer = api(operator).post(f"/api/v1/capacity/clusters/{cluster.pk}/onboard/?dry_run=1")
    assert answer.status_code == 409
    assert answer.json()["detail"].startswith("cluster lost: its kubeconfig cannot be used: ")
    assert not ClusterOnboarding.objects.exists()


def test_api_refuses_non_operators_and_bad_flags(sim, cluster, alice, staff_nobody, operator):
    url = f"/api/v1/capacity/clusters/{cluster.pk}/onboard/"
    for user in (alice, staff_nobody):
        assert api(user).post(f"{url}?dry_run=1").status_code == 403
        assert api(user).post(url).status_code == 403
    assert APIClient().post(url).status_code in (401, 403)
    assert stored(sim, "daemonsets", ("gpuaas-agent", "gpuaas-node-agent")) is None
    bad = api(operator).post(f"{url}?dry_run=maybe")
    assert bad.status_code == 400 and "dry_run" in bad.json()
    assert api(operator).post(url, {"x": 1}, format="json").status_code == 400
    assert not ClusterOnboarding.objects.exists()


# --- admin -----------------------------------------------------------------------------------------


def test_admin_shows_the_diff_then_applies(sim, cluster, client, staff_operator):
    client.force_login(staff_operator)
    url = f"/admin/capacity/cluster/{cluster.pk}/onboard/"
    page = client.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    assert f"{len(expected_objects())} object(s) to create or change" in text
    assert "DaemonSet gpuaas-agent/gpuaas-node-agent" in text
    assert not ClusterOnboarding.objects.exists()
    done = client.post(url, {})
    assert done.status_code == 302
    assert ClusterOnboarding.objects.get().actor == staff_operator
    page = client.get(url).content.decode()
    assert "0 object(s) to create or change" in page
    change = client.get(f"/admin/capacity/cluster/{cluster.pk}/change/").content.decode()
    assert "last applied" in change


def test_admin_previews_the_forced_diff_of_a_conflict(sim, cluster, client, staff_operator, operator):
    onboarding.onboard_cluster(cluster, actor=operator)
    hand_edit_image(sim, "mine:1")
    client.force_login(staff_operator)
    url = f"/admin/capacity/cluster/{cluster.pk}/onboard/"
    refused = client.get(url).content.decode()
    assert "The cluster refused: DaemonSet gpuaas-agent/gpuaas-node-agent:" in refused
    assert "kubectl-edit" in refused
    forced = client.get(url, {"force": "on"}).content.decode()
    assert "1 object(s) to create or change" in forced
    assert "<code>spec.template.spec.containers</code>" in forced
    assert ClusterOnboarding.objects.count() == 1  # previews write nothing


def test_admin_shows_the_clusters_refusal(sim, cluster, client, staff_operator):
    client.force_login(staff_operator)
    sim.server.stop()
    page = client.get(f"/admin/capacity/cluster/{cluster.pk}/onboard/")
    assert page.status_code == 200
    assert "The cluster refused: Namespace gpuaas:" in page.content.decode()
    assert client.post(f"/admin/capacity/cluster/{cluster.pk}/onboard/", {}).status_code == 200
    assert not ClusterOnboarding.objects.exists()


def test_admin_refuses_staff_without_the_permission(sim, cluster, client, staff_nobody):
    client.force_login(staff_nobody)
    assert client.get(f"/admin/capacity/cluster/{cluster.pk}/onboard/").status_code == 403
    assert client.post(f"/admin/capacity/cluster/{cluster.pk}/onboard/", {}).status_code == 403
    assert stored(sim, "daemonsets", ("gpuaas-agent", "gpuaas-node-agent")) is None
    assert not ClusterOnboarding.objects.exists()


def test_the_audit_row_is_json_serialisable(sim, cluster, operator):
    row = onboarding.onboard_cluster(cluster, actor=operator)
    row.refresh_from_db()
    assert json.loads(json.dumps(row.objects_applied))[0] == {
        "kind": "Namespace",
        "namespace": "",
        "name": "gpuaas",
        "action": "create",
    }
