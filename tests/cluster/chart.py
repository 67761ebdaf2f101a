"""Render the rlfleet chart offline (helm-python-sdk: Helm's own library) into a list of Kubernetes objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlfleet.chart.values import merge  # Helm's coalescing of -f files: the chart tool's own

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "rlfleet"
VALUES = ROOT / "deploy" / "values"

# The four scenarios the issue names: each is a list of values files applied in order (like repeated -f).
SCENARIOS: dict[str, list[str]] = {
    "cpu-minimal": ["cpu-minimal.yaml"],
    "play-cpu": ["play-cpu.yaml"],
    "gpu-64gpus-2racks": ["gpu-64gpus-2racks.yaml"],
    "gpu-spares": ["gpu-64gpus-2racks.yaml", "spares.yaml"],
    "gpu-integrations": ["gpu-64gpus-2racks.yaml", "integrations.yaml"],
}


def scenario_values(name: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for file in SCENARIOS[name]:
        values = merge(values, yaml.safe_load((VALUES / file).read_text()) or {})
    return values


def render(values: dict[str, Any] | None = None, release: str = "run1", namespace: str = "team-a") -> list[dict]:
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values=values or {}, name=release, namespace=namespace, is_install=True)
    objects: list[dict] = []
    for path in sorted(manifests):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(manifests[path]):
            if doc:
                objects.append(doc)
    return objects


def notes(values: dict[str, Any] | None = None, release: str = "run1", namespace: str = "team-a") -> str:
    """The chart's NOTES.txt as `helm install` prints it."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values=values or {}, name=release, namespace=namespace, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def component(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in by_kind(objects, kind)
             if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == name]
    assert len(found) == 1, f"expected one {kind} of component {name}, found {len(found)}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    """The pod spec inside any workload kind the chart renders."""
    kind = obj["kind"]
    if kind == "Pod":
        return obj["spec"]
    if kind in ("Deployment", "StatefulSet", "Job"):
        return obj["spec"]["template"]["spec"]
    if kind == "JobSet":
        return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    if kind == "LeaderWorkerSet":
        return obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    raise KeyError(kind)


def all_pod_specs(obj: dict) -> list[dict]:
    if obj["kind"] == "LeaderWorkerSet":
        t = obj["spec"]["leaderWorkerTemplate"]
        return [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
    return [pod_spec(obj)]


WORKLOAD_KINDS = ("Deployment", "StatefulSet", "JobSet", "LeaderWorkerSet")
