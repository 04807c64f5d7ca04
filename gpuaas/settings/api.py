"""The REST API's settings: Django REST framework and the OpenAPI schema (drf-spectacular)."""

from __future__ import annotations

from .env import (
    env_int,
    env_str,
)

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenancy.authentication.ApiTokenAuthentication",
        "tenancy.oidc.authentication.OidcBearerAuthentication",  # the provider's access tokens (OIDC_ISSUER)
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["core.permissions.DeclaredScope"],  # refuses a view that declares no scope
    "DEFAULT_PAGINATION_CLASS": "core.api.Pagination",
    "EXCEPTION_HANDLER": "core.api.exception_handler",  # domain refusals (DomainConflict) are 409s
    "PAGE_SIZE": env_int("API_PAGE_SIZE", 50, minimum=1),
    "DEFAULT_FILTER_BACKENDS": [
        "core.api.FilterBackend",  # integer filters bounded to their column's range
        "core.api.OrderingFilter",  # DRF's, with a NUL character refused as the schema says
    ],
    "DEFAULT_THROTTLE_CLASSES": [
        "gpuaas.web.access.AnonThrottle",  # per client address behind the ingress (TRUSTED_PROXY_COUNT)
        "gpuaas.web.access.UserThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env_str("API_THROTTLE_ANON", "60/minute"),
        "user": env_str("API_THROTTLE_USER", "6000/minute"),
    },
    "DEFAULT_SCHEMA_CLASS": "gpuaas.schema.ApiAutoSchema",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuaas API",
    "DESCRIPTION": "Self-service GPU capacity: projects, pool requests, pools, allocations, metrics and billing.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Request bodies are documented as JSON only: DRF still parses forms (the browsable API), but a form
    # cannot carry what the JSON schema says (a null, a number, a nested object), so documenting form
    # bodies promised requests that are refused.
    "PARSER_WHITELIST": ["rest_framework.parsers.JSONParser"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gpuaas.schema.require_decimal_digits",
        "gpuaas.schema.refuse_nul_in_text",
    ],
    # One OpenAPI enum per choice set, whatever the field is called.
    "ENUM_NAME_OVERRIDES": {
        "SpecKindEnum": "capacity.choices.SpecKind",
        "ReconfigurationStepEnum": "capacity.choices.ReconfigurationStep",
        "ReconfigurationStateEnum": "capacity.choices.ReconfigurationState",
        "ReconfigurationBackendEnum": "capacity.choices.ReconfigurationBackend",
        "ReconfigurationEventEnum": "capacity.choices.ReconfigurationEvent",
        "DrainStepEnum": "capacity.choices.DrainStep",
        "RequestStateEnum": "pools.choices.RequestState",
        "PoolStateEnum": "pools.choices.PoolState",
        "IsolationNeedEnum": "pools.choices.IsolationNeed",
        "IsolationOrNeedEnum": "pools.choices.ISOLATION_OR_NEED",
        "RoleEnum": "tenancy.choices.Role",
        "StatementStateEnum": "billing.choices.StatementState",
        "LineTypeEnum": "billing.choices.LineType",
        "BillingRunKindEnum": "billing.choices.RunKind",
        "BillingRunStatusEnum": "billing.choices.RunStatus",
        "OnboardingStatusEnum": "capacity.choices.OnboardingStatus",
        "ClusterStatusEnum": "capacity.choices.ClusterStatus",
    },
}
