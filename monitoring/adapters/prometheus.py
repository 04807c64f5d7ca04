"""Prometheus text format: scrape and parse an exporter (DCGM exporter), render gpuaas's own /metrics.

The only module that imports prometheus_client. Everything crosses this boundary as plain data:
`PromSample(name, labels, value)` in, `Gauge(name, help, labels, samples)` out.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

MAX_BYTES = 64 * 1024 * 1024


class ScrapeError(Exception):
    """The exporter could not be reached, answered an error, or sent something that is not Prometheus text."""


@dataclass(frozen=True, slots=True)
class PromSample:
    """One sample. `family` is the metric family's name: prometheus_client renames a counter's
    samples to `<family>_total` even when the exposition wrote `<family>` (DCGM's counters do)."""

    name: str
    labels: dict[str, str]
    value: float
    family: str = ""


@dataclass(slots=True)
class Gauge:
    """A gauge family for /metrics: samples are (label values in `labels` order, value)."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)


def parse(text: str) -> list[PromSample]:
    """Every sample of a Prometheus text exposition, in order; ScrapeError if it does not parse."""
    try:
        return [
            PromSample(sample.name, dict(sample.labels), float(sample.value), family.name)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except (ValueError, TypeError, IndexError) as exc:
        raise ScrapeError(f"not Prometheus text: {exc}") from None


def fetch(url: str, *, timeout_s: float) -> str:
    """GET an exporter's metrics page (e.g. http://node:9400/metrics) as text."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - operator-set URL
            body = response.read(MAX_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ScrapeError(f"{url}: {exc}") from None
    if len(body) > MAX_BYTES:
        raise ScrapeError(f"{url}: answer larger than {MAX_BYTES} bytes")
    return body.decode("utf-8", "replace")


class _Families:
    """A collector that yields prepared families (a fresh registry per render: no global state)."""

    def __init__(self, families: list[GaugeMetricFamily]):
        self.families = families

    def collect(self):
        return iter(self.families)


def render(gauges: Iterable[Gauge]) -> tuple[bytes, str]:
    """(body, content type) of a Prometheus text exposition holding `gauges`."""
    families = []
    for gauge in gauges:
        family = GaugeMetricFamily(gauge.name, gauge.help, labels=list(gauge.labels))
        for values, value in gauge.samples:
            family.add_metric(list(values), value)
        families.append(family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry), CONTENT_TYPE_LATEST
