"""Server-side apply of whole objects of any kind, as field manager `gpuaas` (what onboarding installs).

Server-side apply is a PATCH with Content-Type `application/apply-patch+yaml` and a `fieldManager`; the API
server creates the object when it is missing, merges the applied fields otherwise, records which manager owns
each field (metadata.managedFields), and answers 409 Conflict when another manager owns a field the
configuration sets to another value, unless `force=true`, which takes the field over. `dryRun=All` answers the
object the write would produce and persists nothing, which is how the diff is made.
(https://kubernetes.io/docs/reference/using-api/server-side-apply/, "Conflicts", "Using server-side apply
in a controller": controllers should always force; https://kubernetes.io/docs/reference/using-api/api-concepts/
#dry-run.)

The object's URL comes from API discovery (`/api/v1`, `/apis/<group>/<version>`: the kind's resource name
and whether it is namespaced), asked once per group version and client, so any kind the cluster serves can be
applied without a table of plurals here. Calls go through the official client's `ApiClient.call_api` (the
generated per-kind methods would need one branch per kind) and the transport's retries: an apply is idempotent.
"""

from __future__ import annotations

from .errors import Invalid, NotFound
from .transport import Transport

FIELD_MANAGER = "gpuaas"
APPLY_PATCH = "application/apply-patch+yaml"


def _api_base(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


class ApplyCalls(Transport):
    def _raw(self, what: str, method: str, path: str, *, query=(), body=None, content_type: str = "") -> dict:
        """One request through the client's ApiClient (auth, TLS, timeouts), with the transport's retries."""
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type

        def call(**kwargs):
            return self.api_client.call_api(
                path,
                method,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                **kwargs,
            )

        call.__name__ = what
        return self._call(call)

    def resource_of(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(resource name, namespaced) of a kind, from the API server's discovery (cached per group version).

        Invalid when the cluster does not serve the kind (a CRD not installed, an API not enabled)."""
        cache = self.__dict__.setdefault("_discovered", {})
        if api_version not in cache:
            try:
                listing = self._raw(f"discover {api_version}", "GET", _api_base(api_version))
            except NotFound:
                listing = {}
            cache[api_version] = {
                r["kind"]: (r["name"], bool(r.get("namespaced")))
                for r in listing.get("resources") or ()
                if "/" not in r.get("name", "")
            }
        found = cache[api_version].get(kind)
        if found is None:
            raise Invalid(f"{self.host} does not serve {kind} in {api_version}", status=None)
        return found

    def object_path(self, obj: dict) -> str:
        meta = obj.get("metadata") or {}
        plural, namespaced = self.resource_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        base = _api_base(obj["apiVersion"])
        if namespaced:
            return f"{base}/namespaces/{meta.get('namespace') or 'default'}/{plural}/{meta['name']}"
        return f"{base}/{plural}/{meta['name']}"

    def read_object(self, obj: dict) -> dict | None:
        """The object as the cluster holds it now (identified by apiVersion, kind, namespace, name); None if absent."""
        try:
            return self._raw(f"get {obj['kind']}", "GET", self.object_path(obj))
        except NotFound:
            return None

    def apply_object(self, obj: dict, *, force: bool = False, dry_run: bool = False) -> dict:
        """Server-side apply `obj` as field manager gpuaas; the object as the server answers it.

        Conflict (409) when another manager owns a field `obj` sets differently and `force` is False;
        `dry_run`: nothing is persisted (dryRun=All), the answer is the would-be object."""
        query = [("fieldManager", FIELD_MANAGER)]
        if force:
            query.append(("force", "true"))
        if dry_run:
            query.append(("dryRun", "All"))
        return self._raw(
            f"apply {obj.get('kind')}", "PATCH", self.object_path(obj), query=query, body=obj, content_type=APPLY_PATCH
        )
