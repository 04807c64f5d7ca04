"""The simulated kube-apiserver's JSON patch and merge patch (jsonpatch, json-merge-patch): RFC semantics and
kube-apiserver's answers when a patch does not apply."""

from __future__ import annotations

import pytest

from simcluster import kube

NODE = {"metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}}, "spec": {"taints": [{"key": "x"}]}}


def test_merge_patch_merges_deletes_with_null_and_replaces_lists():
    patched = kube.merge_patch(NODE, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"taints": []}})
    assert patched == {"metadata": {"name": "n1", "labels": {"b": "2", "c": "3"}}, "spec": {"taints": []}}
    assert NODE["metadata"]["labels"] == {"a": "1", "b": "2"}  # the stored object is never changed in place


def test_merge_patch_keeps_no_reference_to_the_patch():
    patch = {"spec": {"taints": [{"key": "y"}]}}
    patched = kube.merge_patch(NODE, patch)
    patch["spec"]["taints"][0]["key"] = "changed"
    assert patched["spec"]["taints"] == [{"key": "y"}]


def test_json_patch_applies_every_operation_in_order():
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/c"},
        {"op": "move", "from": "/metadata/labels/b", "path": "/metadata/labels/d"},
        {"op": "add", "path": "/spec/taints/-", "value": {"key": "z"}},
        {"op": "replace", "path": "/metadata/name", "value": "n2"},
        {"op": "remove", "path": "/spec/taints/0"},
    ]
    patched = kube.json_patch(NODE, ops)
    assert patched == {
        "metadata": {"name": "n2", "labels": {"a": "1", "c": "1", "d": "2"}},
        "spec": {"taints": [{"key": "z"}]},
    }
    assert NODE["metadata"]["name"] == "n1"


def test_a_failed_test_names_its_own_path_and_changes_nothing():
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "replace", "path": "/metadata/name", "value": "n2"},
        {"op": "test", "path": "/metadata/labels/b", "value": "wrong"},
    ]
    with pytest.raises(kube.ApiError) as exc:
        kube.json_patch(NODE, ops)
    assert exc.value.code == 422
    assert "testing value /metadata/labels/b failed" in exc.value.message
    assert NODE["metadata"]["name"] == "n1"


@pytest.mark.parametrize(
    ("ops", "code"),
    [
        ([{"op": "remove", "path": "/metadata/labels/missing"}], 422),
        ([{"op": "replace", "path": "/spec/taints/5", "value": 1}], 422),
        ([{"op": "frobnicate", "path": "/metadata"}], 400),
        ([{"op": "add", "value": 1}], 400),
    ],
)
def test_an_operation_that_does_not_apply_is_refused(ops, code):
    with pytest.raises(kube.ApiError) as exc:
        kube.json_patch(NODE, ops)
    assert exc.value.code == code
