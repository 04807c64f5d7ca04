"""Shared REST API pieces: pagination, the filter backend and the router every app registers on.

Who may call what is decided in one place, core/permissions.py (DeclaredScope, the default
permission class, and the queryset mixins every scoped view uses).

Numbers in a query string are checked here, once for every list endpoint: a page number or an
integer filter that no database column could hold is a 400 naming the parameter, never a query that
the database driver refuses with an OverflowError (a 500).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import connections
from django_filters import filters
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.utils import get_model_field
from rest_framework import exceptions, serializers, status
from rest_framework import filters as drf_filters
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.routers import APIRootView, DefaultRouter
from rest_framework.views import exception_handler as drf_exception_handler

from .scopes import Scope


class Conflict(exceptions.APIException):
    """409: the object's state does not allow this (a view's own refusal, with its message)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The object's state does not allow this."
    default_code = "conflict"


class DomainConflict(Exception):
    """A refusal by a workflow's rules (its state, or capacity short): the API answers 409.

    Apps subclass it for their domain errors (pools.exceptions.DomainError, billing's
    StatementFinalised, a reconfiguration's IllegalTransition), so services raise what they mean and no
    view translates it; `detail` adds typed fields to the body (counts stay numbers).
    """

    def __init__(self, message: str, *, detail: dict | None = None):
        super().__init__(message)
        self.message = message
        self.detail = detail or {}


def exception_handler(exc, context):
    """DRF's handler, with a DomainConflict as a 409 `{"detail": message, **detail}` (settings EXCEPTION_HANDLER)."""
    if isinstance(exc, DomainConflict):
        return Response({"detail": exc.message, **exc.detail}, status=status.HTTP_409_CONFLICT)
    return drf_exception_handler(exc, context)


# The widest integer column of any supported database (SQLite's INTEGER, PostgreSQL's bigint).
BIGINT_RANGE = (-(2**63), 2**63 - 1)


class Pagination(PageNumberPagination):
    """`?page=N&page_size=M`: N a whole number from 1 (or `last`), M from 1 to max_page_size; anything
    else is a 400 naming the parameter. A page past the end stays a 404, as DRF answers."""

    page_size_query_param = "page_size"
    max_page_size = 1000

    def paginate_queryset(self, queryset, request, view=None):
        self._validate(request)
        return super().paginate_queryset(queryset, request, view)

    def _validate(self, request) -> None:
        page = serializers.IntegerField(min_value=1, max_value=BIGINT_RANGE[1])
        page_size = serializers.IntegerField(min_value=1, max_value=self.max_page_size)
        params = request.query_params
        errors = {}
        for name, field in ((self.page_query_param, page), (self.page_size_query_param, page_size)):
            value = params.get(name)
            if value is None or (name == self.page_query_param and value in self.last_page_strings):
                continue
            try:
                field.run_validation(value)
            except serializers.ValidationError as exc:
                errors[name] = exc.detail
        if errors:
            raise serializers.ValidationError(errors)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.page_query_param: {"minimum": 1, "maximum": BIGINT_RANGE[1]},
            self.page_size_query_param: {"minimum": 1},
        }
        bounds[self.page_size_query_param]["maximum"] = self.max_page_size
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters


def column_range(model, field_name: str, connection) -> tuple[int, int] | None:
    """The (min, max) an integer column reached by `field_name` (a django-filter path such as
    `project_id` or `allocation__pool_id`) holds on `connection`; None for a column that is not an
    integer; the widest integer range when the path names no column (a filter with a method)."""
    field = get_model_field(model, field_name)
    if field is None:
        return BIGINT_RANGE
    while field.is_relation:  # a foreign key compares the column of the key it points at
        target = getattr(field, "target_field", None)
        if target is None or target is field:
            return None
        field = target
    try:
        return connection.ops.integer_field_range(field.get_internal_type())
    except KeyError:
        return None


class FilterBackend(DjangoFilterBackend):
    """django-filter's backend (settings: DEFAULT_FILTER_BACKENDS), with every number filter bounded
    to the range of the integer column it compares with on the queryset's database, and whole. Out of
    range (or 2.5) is a 400 naming the filter, on every FilterSet, declared or generated from
    `filterset_fields`; so is a value django-filter would otherwise ignore (_refuse_unread_values).
    Model-choice filters need no bound: their primary-key lookup answers "not a valid choice"."""

    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        if filterset is not None:
            _refuse_unread_values(filterset, request.query_params)
            connection = connections[queryset.db]
            for filter_ in filterset.filters.values():
                if isinstance(filter_, filters.NumberFilter):
                    bounds = column_range(filterset._meta.model or queryset.model, filter_.field_name, connection)
                    if bounds is not None:
                        _bound(filter_.field, *bounds)
        return filterset


# The spellings of a boolean filter that django-filter reads as true or false; it reads anything else
# ("5e-324", "yes", "") as "not filtered", answering 200 to a value the schema refuses.
BOOLEAN_SPELLINGS = frozenset({"true", "false", "True", "False", "1", "0"})


def _refuse_unread_values(filterset, params) -> None:
    """A 400 naming each filter given a value django-filter would silently ignore: an empty value of
    any filter but a plain text one (for which "" is a value), and a boolean that is not true or false."""
    errors = {}
    for name, filter_ in filterset.filters.items():
        values = params.getlist(name)
        if not values:
            continue
        if isinstance(filter_, filters.BooleanFilter):
            if any(value not in BOOLEAN_SPELLINGS for value in values):
                errors[name] = ["Must be true or false."]
        elif "" in values and not _takes_empty(filter_):
            errors[name] = ["Give a value, or leave the filter out."]
    if errors:
        raise serializers.ValidationError(errors)


def _takes_empty(filter_) -> bool:
    """Whether "" is a value the schema offers for this filter: any text, or a choice named ""."""
    if type(filter_) is filters.CharFilter:
        return True
    choices = filter_.extra.get("choices") or ()
    if callable(choices):
        choices = choices()
    return any(value == "" for value, _label in choices)


def _whole(value) -> None:
    """An integer as written: "0.0" and "1e3" are numbers the schema's integer does not take."""
    if value is not None and value.as_tuple().exponent != 0:
        raise ValidationError("Enter a whole number.")


def _bound(field, low: int, high: int) -> None:
    """Validate `field` against [low, high], in place of any looser bound (django-filter's 1e50)."""
    looser = [
        v
        for v in field.validators
        if (isinstance(v, MaxValueValidator) and v.limit_value >= high)
        or (isinstance(v, MinValueValidator) and v.limit_value <= low)
    ]
    field.validators = [v for v in field.validators if v not in looser]
    field.validators += [_whole, MinValueValidator(low), MaxValueValidator(high)]


class OrderingFilter(drf_filters.OrderingFilter):
    """DRF's ordering filter, refusing what the schema refuses: every text parameter takes no NUL character
    (gpuaas.schema.NO_NUL_PATTERN), and DRF would silently ignore such an ordering and answer 200."""

    def get_ordering(self, request, queryset, view):
        if any("\x00" in value for value in request.query_params.getlist(self.ordering_param)):
            raise serializers.ValidationError({self.ordering_param: ["Null characters are not allowed."]})
        return super().get_ordering(request, queryset, view)


class QuerySerializer(serializers.Serializer):
    """The parameters of a query string. DRF reads an empty optional field of a form or query string
    as absent (`?start=` as no start), so a value the schema refuses ("" for a date-time, an integer,
    a non-blank text) would be answered as if left out: here it is a 400 naming the parameter."""

    def to_internal_value(self, data):
        errors = {
            name: [
                field.error_messages["blank"] if "blank" in field.error_messages else "Give a value, or leave it out."
            ]
            for name, field in self.fields.items()
            if not field.read_only and not getattr(field, "allow_blank", False) and "" in _values(data, name)
        }
        if errors:
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


def _values(data, name: str) -> list:
    return data.getlist(name) if hasattr(data, "getlist") else [data.get(name)]


class ApiRootView(APIRootView):
    """The browsable index of the API: a list of links, for any signed-in user (as before)."""

    scope = Scope.SIGNED_IN


class Router(DefaultRouter):
    APIRootView = ApiRootView


router = Router()


def usernames_only(*relations: str) -> list[str]:
    """`defer()` arguments that load only the id and username of each user relation in `relations`.

    List serializers show a user as their username (SlugRelatedField); select_related would otherwise
    read every column of auth_user, the password hash included, for each row of a page.
    """
    from django.contrib.auth import get_user_model

    User = get_user_model()
    kept = {User._meta.pk.name, User.USERNAME_FIELD}
    names = [f.name for f in User._meta.concrete_fields if f.name not in kept]
    return [f"{relation}__{name}" for relation in relations for name in names]
