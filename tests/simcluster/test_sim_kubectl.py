"""A real `kubectl` (1.32 here) against the simulator: what an operator types must work as against a cluster.

Get (the server's Table), label, cordon, server-side apply (create, a second manager's conflict), strict
validation (kubectl reads /openapi/v3, sees the PATCH operation's `fieldValidation` parameter and leaves the
check to the server) and explain (the v3 schema). Skipped where kubectl is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed on this machine")

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: default
data:
  mode: {mode}
"""


@pytest.fixture
def kubectl(kubeconfigs, tmp_path):
    """Run kubectl against the `prod` cluster with a cache of its own (discovery and OpenAPI are cached)."""

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfigs["prod"]), "--cache-dir", str(tmp_path / "cache"), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


@pytest.fixture
def manifest(tmp_path):
    def write(mode: str = "fast", extra: str = "") -> str:
        path = tmp_path / f"cm-{mode}.yaml"
        path.write_text(CONFIGMAP.format(mode=mode) + extra)
        return str(path)

    return write


def test_get_prints_the_server_table(kubectl):
    got = kubectl("get", "nodes")
    assert got.returncode == 0, got.stderr
    header, *rows = got.stdout.splitlines()
    assert header.split() == ["NAME", "CREATED", "AT"]
    assert rows and all(row.split()[0].startswith("prod-") for row in rows)
    short = kubectl("get", "cm", "-n", "gpu-operator")  # short names come from discovery
    assert short.returncode == 0, short.stderr


def test_label_and_cordon(kubectl):
    node = kubectl("get", "nodes", "-o", "name").stdout.split()[0]
    labelled = kubectl("label", node, "team=vision")
    assert labelled.returncode == 0, labelled.stderr
    cordoned = kubectl("cordon", node)
    assert cordoned.returncode == 0, cordoned.stderr
    got = json.loads(kubectl("get", node, "-o", "json").stdout)
    assert got["metadata"]["labels"]["team"] == "vision"
    assert got["spec"]["unschedulable"] is True


def test_server_side_apply_creates_then_reports_a_conflict(kubectl, manifest):
    created = kubectl("apply", "--server-side", "-f", manifest("fast"))
    assert created.returncode == 0, created.stderr
    assert "configmap/settings serverside-applied" in created.stdout
    clash = kubectl("apply", "--server-side", "--field-manager=other", "-f", manifest("slow"))
    assert clash.returncode != 0
    assert 'conflict with "kubectl" using v1: .data.mode' in clash.stderr
    forced = kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", manifest("slow"))
    assert forced.returncode == 0, forced.stderr
    assert kubectl("get", "configmap", "settings", "-o", "jsonpath={.data.mode}").stdout == "slow"


def test_strict_validation_rejects_unknown_fields(kubectl, manifest):
    good = kubectl("apply", "--validate=strict", "--server-side", "-f", manifest("fast"))
    assert good.returncode == 0, good.stderr
    bad = manifest("typo", extra="dataa:\n  x: y\n")
    for args in (("apply", "--server-side"), ("create",)):
        refused = kubectl(*args, "--validate=strict", "-f", bad)
        assert refused.returncode != 0
        assert 'strict decoding error: unknown field "dataa"' in refused.stderr
    warned = kubectl("apply", "--server-side", "--validate=warn", "-f", bad)
    assert warned.returncode == 0, warned.stderr
    assert 'unknown field "dataa"' in warned.stderr


def test_explain_reads_the_v3_schema(kubectl):
    node = kubectl("explain", "node.spec")
    assert node.returncode == 0, node.stderr
    assert "unschedulable" in node.stdout and "taints" in node.stdout
    crd = kubectl("explain", "clusterpolicy")
    assert crd.returncode == 0, crd.stderr
    assert "GROUP:      nvidia.com" in crd.stdout
