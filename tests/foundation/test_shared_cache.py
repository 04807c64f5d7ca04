"""API throttle counters live in a cache every process shares (files under var/ or Redis), never per process."""

import time

import pytest
from django.conf import settings
from django.core.cache import caches

SHARED = {"django.core.cache.backends.filebased.FileBasedCache", "django.core.cache.backends.redis.RedisCache"}


def test_cache_is_shared_not_per_process():
    assert settings.CACHES["default"]["BACKEND"] in SHARED


def test_a_second_cache_connection_sees_and_sets_the_throttle_counter(client, bob):
    """Another process's connection (a new backend instance) reads the same counter, and its writes count."""
    other = caches.create_connection("default")
    client.force_login(bob)
    assert client.get("/api/v1/projects/").status_code == 200
    key = f"throttle_user_{bob.pk}"
    assert len(other.get(key)) == 1

    limit = int(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["user"].split("/")[0])
    other.set(key, [time.time()] * limit, 60)
    response = client.get("/api/v1/projects/")
    assert response.status_code == 429
    assert len(other.get(key)) == limit  # the refused request is not counted


@pytest.mark.redis
def test_throttle_counter_is_in_redis_on_the_services_run(client, bob):
    import redis

    assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    client.force_login(bob)
    assert client.get("/api/v1/projects/").status_code == 200
    raw = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    assert raw.exists(f"gpuaas:1:throttle_user_{bob.pk}") == 1
