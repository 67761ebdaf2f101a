"""Metric names as a scrape of /metrics shows them, and metric names as PromQL queries use them."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client import CollectorRegistry

from rlfleet.runtime import metrics as m

_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "gauge": ("",), "summary": ("_sum", "_count", "_created", ""), "untyped": ("",), "info": ("_info",)}
_NAME = re.compile(r"(?<![\w:])(rlfleet_[a-zA-Z0-9_]*)")



def names_in_exposition(text: str) -> set[str]:
    """Every series name a Prometheus scrape of this text can store (from the # TYPE lines and the samples)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            kind = kind.strip()
            if kind == "counter":  # exposition writers differ on whether the TYPE line carries _total
                name = name.removesuffix("_total")
            names.update(name + suffix for suffix in _SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def scrape(port: int, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:  # noqa: S310
        return resp.read().decode()


def sdk_registry() -> CollectorRegistry:
    """Every metric class of rlfleet.runtime.metrics in one registry, as the four services and the
    controller build them."""
    registry = CollectorRegistry()
    m.RolloutMetrics(registry, replica="rollout-0")
    m.BufferMetrics(registry)
    m.TrainerMetrics(registry)
    m.WeightSyncMetrics(registry)
    m.ControllerMetrics(registry)
    return registry


def names_in_promql(expr: str) -> set[str]:
    """rlfleet_* series names a PromQL expression reads (recording-rule names with ':' are not series names)."""
    return set(_NAME.findall(expr))
