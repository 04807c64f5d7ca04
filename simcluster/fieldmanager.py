"""Server-side apply and field ownership (metadata.managedFields), as kube-apiserver keeps them.

What a real API server does (https://kubernetes.io/docs/reference/using-api/server-side-apply/):
- an apply (PATCH, Content-Type application/apply-patch+yaml, `fieldManager` required) creates the object
  when it does not exist, else merges the applied configuration into it;
- every field has owners: the managers that applied it ("Apply") or last changed it through create, update or
  another patch ("Update", the manager being `fieldManager` or the client's User-Agent up to its first '/');
- applying a value to a field that another manager owns with a different value is a 409 Conflict naming the
  manager and the field, unless `force=true`, which moves the field to the applier; applying the same value
  shares the ownership;
- a field the applier owned and no longer applies is removed, unless another manager still owns it;
- `dryRun=All` answers the would-be object and stores nothing.

Simplifications (the simulator's, not the API server's): ownership is kept per map key down to leaves, and every
list is atomic (owned and replaced whole; the API server merges lists marked `listType: map` by key). Pods and
nodes keep no managedFields (their writers are the simulator's own controllers and the hot paths).
"""

from __future__ import annotations

import copy

Path = tuple[str, ...]

# Fields the server owns or that identify the object: never owned by a manager.
_IGNORED_TOP = {"apiVersion", "kind", "status"}
_IGNORED_META = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "managedFields",
    "selfLink",
}


def manager_from(field_manager: str | None, user_agent: str) -> str:
    """The manager of a non-apply write: `fieldManager`, else the User-Agent up to its first '/'."""
    if field_manager:
        return field_manager
    return (user_agent or "unknown").split("/")[0][:128] or "unknown"


def leaves(obj: dict) -> dict[Path, object]:
    """Every owned field of an object and its value: map keys down to leaves; lists and scalars are leaves."""
    out: dict[Path, object] = {}

    def walk(value: object, path: Path) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, (*path, key))
        else:
            out[path] = value

    for key, value in obj.items():
        if key in _IGNORED_TOP:
            continue
        if key == "metadata" and isinstance(value, dict):
            for mkey, mvalue in value.items():
                if mkey not in _IGNORED_META:
                    walk(mvalue, ("metadata", mkey))
            continue
        walk(value, (key,))
    return out


def to_fields_v1(paths: set[Path]) -> dict:
    """A set of field paths in the API server's FieldsV1 form: {"f:spec": {"f:replicas": {}}}."""
    root: dict = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return root


def from_fields_v1(fields: dict) -> set[Path]:
    """The leaf paths of a FieldsV1 document (the inverse of to_fields_v1; "." and "k:"/"v:" keys are kept)."""
    out: set[Path] = set()

    def walk(node: dict, path: Path) -> None:
        children = [k for k in node if k != "."]
        if not children:
            if path:
                out.add(path)
            return
        for key in children:
            walk(node[key] or {}, (*path, key[2:] if key.startswith("f:") else key))

    walk(fields or {}, ())
    return out


def _owners(obj: dict | None) -> list[dict]:
    return [dict(entry) for entry in ((obj or {}).get("metadata") or {}).get("managedFields") or ()]


def _value(obj: object, path: Path) -> object:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


_MISSING = object()


def _overlaps(a: Path, b: Path) -> bool:
    short = min(len(a), len(b))
    return a[:short] == b[:short]


def _entries(managed: list[dict]) -> list[tuple[dict, set[Path]]]:
    return [(entry, from_fields_v1(entry.get("fieldsV1") or {})) for entry in managed]


def _render(entries: list[tuple[dict, set[Path]]], api_version: str) -> list[dict]:
    out = []
    for entry, paths in entries:
        if paths:
            out.append({**entry, "apiVersion": api_version, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)})
    return out


def _merge(current: object, config: object) -> object:
    """The applied configuration merged into the current object: maps key by key, everything else replaced."""
    if isinstance(current, dict) and isinstance(config, dict):
        merged = dict(current)
        for key, value in config.items():
            merged[key] = _merge(current.get(key), value) if key in current else copy.deepcopy(value)
        return merged
    return copy.deepcopy(config)


def _remove(obj: dict, path: Path) -> None:
    """Remove a field and the maps it leaves empty."""
    parents = [obj]
    for key in path[:-1]:
        node = parents[-1].get(key)
        if not isinstance(node, dict):
            return
        parents.append(node)
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if parents[depth]:
            break
        parents[depth - 1].pop(path[depth - 1], None)


def record_update(old: dict | None, new: dict, manager: str, at: str, api_version: str) -> list[dict]:
    """managedFields after a create, update or non-apply patch by `manager`: the fields it set or changed become
    its own ("Update"), taken from their previous owners; fields it removed leave every owner."""
    before = leaves(old) if old is not None else {}
    after = leaves(new)
    changed = {p for p, v in after.items() if before.get(p, _MISSING) != v}
    removed = set(before) - set(after)
    entries = _entries(_owners(old))
    for _, paths in entries:
        paths.difference_update({p for p in paths for q in changed | removed if _overlaps(p, q)})
    if changed:
        mine = next((e for e in entries if e[0].get("manager") == manager and e[0].get("operation") == "Update"), None)
        if mine is None:
            mine = ({"manager": manager, "operation": "Update"}, set())
            entries.append(mine)
        mine[0]["time"] = at
        mine[1].update(changed)
    return _render(entries, api_version)


def conflict_error(kind: str, name: str, conflicts: list[tuple[str, Path]], api_version: str):
    """The API server's 409 (an ApiError) for an apply that would take fields other managers own."""
    from .kube import ApiError  # kube imports this module

    fields = [(manager, "." + ".".join(path)) for manager, path in conflicts]
    lines = [f'conflict with "{manager}" using {api_version}: {field}' for manager, field in fields]
    noun = "conflict" if len(lines) == 1 else "conflicts"
    message = f"Apply failed with {len(lines)} {noun}: " + ("\n".join(lines) if len(lines) > 1 else lines[0])
    return ApiError(
        409,
        "Conflict",
        message,
        {
            "name": name,
            "kind": kind,
            "causes": [
                {"type": "FieldManagerConflict", "message": f'conflict with "{who}" using {api_version}', "field": f}
                for who, f in fields
            ],
        },
    )


def apply(
    current: dict | None, config: dict, manager: str, *, force: bool, at: str, kind: str, api_version: str
) -> tuple[dict, list[dict]]:
    """(the object after applying `config` as `manager`, its managedFields). 409 (conflict_error) when another
    manager owns a field that `config` sets to another value, unless `force`. `current` None: a create."""
    base = copy.deepcopy(current) if current is not None else {}
    applied = leaves(config)
    entries = _entries(_owners(current))
    merged = _merge(base, config)
    conflicts: list[tuple[str, Path]] = []
    for entry, paths in entries:
        if entry.get("manager") == manager:
            continue
        for owned in sorted(paths):
            for path in applied:
                if not _overlaps(owned, path):
                    continue
                shorter = owned if len(owned) <= len(path) else path
                if _value(base, shorter) != _value(merged, shorter):
                    conflicts.append((entry.get("manager", ""), owned))
                    break
    if conflicts and not force:
        name = (config.get("metadata") or {}).get("name", "")
        raise conflict_error(kind, name, conflicts, api_version)
    if force:
        taken = set(conflicts)
        for entry, paths in entries:
            paths.difference_update({p for p in paths if (entry.get("manager", ""), p) in taken})
    mine = next((e for e in entries if e[0].get("manager") == manager and e[0].get("operation") == "Apply"), None)
    if mine is None:
        mine = ({"manager": manager, "operation": "Apply"}, set())
        entries.append(mine)
    dropped = mine[1] - set(applied)
    others = {p for entry, paths in entries if entry is not mine[0] for p in paths}
    for path in sorted(dropped, key=len, reverse=True):
        if not any(_overlaps(path, p) for p in others | set(applied)):
            _remove(merged, path)
    if set(applied) != mine[1] or current is None:
        mine[0]["time"] = at
    mine[0].setdefault("time", at)
    mine[1].clear()
    mine[1].update(applied)
    return merged, _render(entries, api_version)
