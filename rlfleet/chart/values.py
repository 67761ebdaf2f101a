"""A stack of values files merged the way Helm merges them, over the chart's own values.yaml, and the run config the
chart renders from it (deploy/helm/rlfleet/templates/configmap-config.yaml: its GPU defaults are repeated here, and
tests/cluster/test_values_check.py compares them with a real render)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlfleet.config.rollout import RolloutConfig
from rlfleet.config.trainer import TrainerConfig

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "rlfleet"


class ValuesError(ValueError):
    """A values file that cannot be read, or values the check cannot make sense of."""


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of -f files: maps merge key by key, everything else (lists too) is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_values(files: Sequence[Path], chart: Path = CHART) -> dict[str, Any]:
    """chart/values.yaml, then each file in order."""
    values: dict[str, Any] = {}
    for path in [chart / "values.yaml", *files]:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValuesError(f"{path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ValuesError(f"{path}: a values file is a mapping, not {type(loaded).__name__}")
        values = merge(values, loaded)
    return values


@dataclass(frozen=True)
class Rendered:
    """What the chart makes of the values: the run config's rollout and trainer sections, and which side runs on
    GPUs (image variant cuda and GPUs asked for)."""

    rollout: RolloutConfig
    trainer: TrainerConfig
    gpu_rollout: bool
    gpu_trainer: bool
    trainer_ranks_per_pod: int


def rendered(values: dict[str, Any]) -> Rendered:
    cuda = values["image"]["variant"] == "cuda"
    t, r = values["trainer"], values["rollout"]
    gpu_trainer = cuda and int(t["gpusPerPod"]) > 0
    gpu_rollout = cuda and int(r["gpusPerReplica"]) > 0
    per_pod = int(t.get("ranksPerPod") or 0) or max(int(t["gpusPerPod"]), 1)     # rlfleet.trainerRanksPerPod
    run = values.get("runConfig", {})
    rollout = dict(run.get("rollout") or {})
    if gpu_rollout:                                     # configmap-config.yaml's defaults for a GPU replica
        sglang = dict(rollout.get("sglang") or {})
        sglang.setdefault("python", "/opt/sglang/bin/python")
        sglang.setdefault("tp", int(r["gpusPerReplica"]))
        sglang.setdefault("mem_fraction_static", 0.85)
        rollout["sglang"] = sglang
    trainer = {**(run.get("trainer") or {}), "world_size": int(t["pods"]) * per_pod}
    try:
        return Rendered(RolloutConfig.model_validate(rollout), TrainerConfig.model_validate(trainer),
                        gpu_rollout, gpu_trainer, per_pod)
    except ValueError as exc:
        raise ValuesError(f"runConfig: {exc}") from exc
