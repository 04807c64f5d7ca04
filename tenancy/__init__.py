"""tenancy: who may do what, and to which project.

Owns Project, ApiToken (hashed `gpa_` bearer tokens), IdentityGroupRole and ExternalIdentity (models), the
project roles on django-guardian, one group per (project, role) with object permissions on Project only
(roles: set_role, projects_for, role_of), token and lock-out services (services), the bearer-token
authentication (authentication), company sign-in through OpenID Connect (oidc/), and the `issue_token`
and `operators_group` commands. It has no tasks.

Layer: the bottom app. It sits above core.celery, core.leases and core.admin_paging (its admin pages by
estimate) and below core.api, core.permissions, core.scopes and core.admin_permissions, which ask it who
may do what; every app above scopes its rows with `project__in=projects_for(user)`. It imports no app, only
core's bottom layer (lint-imports keeps it so), and sends no signals: the apps above read Project and
tenancy.roles; nothing in tenancy calls up.
"""
