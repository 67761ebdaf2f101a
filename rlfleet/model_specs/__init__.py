"""Model specs (model.specs): user torch.nn.Modules that replace modules of the policy model by dotted path, applied
by the same code in the FSDP trainer (before LoRA, hooks, R3 and FSDP wrapping) and the torch engine (before its
decoder is chosen); and R3's router score functions by router class (model.router_scores).

loading.py imports and checks a spec's class against rlfleet.protocols.ModuleReplacement; paths.py resolves a dotted
target with patterns; apply.py builds each replacement from the module it replaces (so weights carry over), checks the
state dict is unchanged, assigns it and records what it replaced; check.py is `rlfleet check`'s pass on a meta-device
model; router_scores.py loads model.router_scores. The SDK imports no service: trainer and rollout import this door.
"""

from rlfleet.model_specs.apply import AppliedSpec, apply_specs, check_same_state
from rlfleet.model_specs.check import check_model_specs, meta_model
from rlfleet.model_specs.loading import ModuleSpec, load_spec, load_specs
from rlfleet.model_specs.paths import ModelSpecError, resolve
from rlfleet.model_specs.router_scores import load_router_scores

__all__ = ["AppliedSpec", "ModelSpecError", "ModuleSpec", "apply_specs", "check_model_specs", "check_same_state",
           "load_router_scores", "load_spec", "load_specs", "meta_model", "resolve"]
