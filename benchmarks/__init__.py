"""Benchmarks and load generators behind `python manage.py bench NAME`: not a Django app, and no app imports it.

It sits in the top layer beside the `gpuaas` project package: each module registers its benchmarks
with `registry.benchmark` and may import any app. Nothing here runs in production.
This file imports nothing, so that loadgen's spawned worker processes load no Django.
"""
