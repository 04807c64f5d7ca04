"""Shared REST API pieces: pagination and the router every app registers on."""

from rest_framework.pagination import PageNumberPagination
from rest_framework.routers import DefaultRouter


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 1000


router = DefaultRouter()
