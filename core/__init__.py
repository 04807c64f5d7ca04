"""core: the shared kernel under every app.

Owns the Celery app (`core.celery`), workflow leases (`core.leases`), the API's base classes, router and
exception handler (`core.api`), declared scopes and the one permission class (`core.scopes`,
`core.permissions`), and the admin's permission hooks and paginator (`core.admin_permissions`,
`core.admin_paging`). It has no models. It may import Django, DRF, Celery and `tenancy` (who may do what);
every app may import it; it imports no app above it (import-linter's layers in pyproject.toml).
"""
