"""`rlfleet check` for model.specs and model.router_scores: import and check every replacement and score function,
then apply the specs to the model built on the meta device from its config.json (no weights read), so a target that
matches nothing, a from_module that fails or a changed state dict is refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import torch

from rlfleet.config.model_specs import ModuleSpecConfig
from rlfleet.model_specs.apply import AppliedSpec, apply_specs
from rlfleet.model_specs.loading import load_specs
from rlfleet.model_specs.router_scores import load_router_scores


def meta_model(model_path: Path) -> torch.nn.Module:
    """model_path's architecture with every tensor on the meta device (no memory, no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def check_model_specs(specs: list[ModuleSpecConfig], router_scores: dict[str, str],
                      model_path: Path | None) -> list[AppliedSpec]:
    """Raise ModelSpecError / PluginError for the first spec or score function that would fail at start-up.
    model_path None (model.prepare builds it later): the imports and contracts only."""
    loaded = load_specs(specs)
    load_router_scores(router_scores)
    if not loaded or model_path is None:
        return []
    return apply_specs(meta_model(model_path), loaded)
