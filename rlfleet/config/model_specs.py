"""model.specs and model.router_scores: user modules that replace modules of the policy model by dotted path, and R3's
router score functions by router class (rlfleet/model_specs/ applies them; rlfleet.protocols holds the contracts)."""

from __future__ import annotations

from pydantic import Field

from rlfleet.config.section import Section


class ModuleSpecConfig(Section):
    """One replacement: every module at `target` is replaced by `replace`'s from_module(original, path)."""

    target: str = Field(description="Dotted module path in the HF model, e.g. model.layers.*.mlp; a part may be a "
                        "pattern (* any one name, 0 one index, [01] a set).")
    replace: str = Field(description="'package.module:Class': a torch.nn.Module class with a classmethod "
                         "from_module(original, path) (rlfleet.protocols.ModuleReplacement).")
