"""A model spec that cannot work is refused before anything starts, by the check `rlfleet check` and `rlfleet run`
run (rlfleet/local/preflight.py check_plugins), with the spec and the path in the message; a backend or engine that
would run without the spec is refused by the config check."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.config import ConfigError, check_trainer, load_config
from rlfleet.local.preflight import check_plugins
from rlfleet.model_specs import ModelSpecError
from rlfleet.plugins import PluginError
from tests.support.runs import EXAMPLE
from tests.support.tiny_model import make_tiny_model

CASES = "tests.support.model_spec_cases"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def _check(tiny: Path, target: str, replace: str) -> None:
    cfg = load_config(EXAMPLE, {"model.path": str(tiny), "eval.data_source": None,
                                "model.specs": [{"target": target, "replace": replace}]})
    check_trainer(cfg)
    check_plugins(cfg)


@pytest.mark.parametrize(("target", "replace", "message"), [
    ("model.layers.*.mlpx", "examples.model_specs.plain_mlp:PlainMlp",
     r"model.specs\[0\].target 'model.layers.\*.mlpx': no module matches 'mlpx' under model.layers.\* "
     r"\(it has: .*mlp.*self_attn"),
    ("model.layers.7.mlp", "examples.model_specs.plain_mlp:PlainMlp",
     r"no module matches '7' under model.layers \(it has: 0, 1\)"),
    ("model.layers.*.mlp", "no_such_pkg.blocks:Mlp",
     r"model.specs\[0\].replace 'no_such_pkg.blocks:Mlp': module 'no_such_pkg.blocks' could not be imported"),
    ("model.layers.*.mlp", "examples.model_specs.plain_mlp:Missing",
     r"model.specs\[0\].replace 'examples.model_specs.plain_mlp:Missing': module .* has no attribute 'Missing'"),
    ("model.layers.*.mlp", f"{CASES}:not_a_class", r"'tests.support.model_spec_cases:not_a_class': function .* is "
     r"not a torch.nn.Module class"),
    ("model.layers.*.mlp", f"{CASES}:NoFromModule", r"NoFromModule has no classmethod from_module"),
    ("model.layers.*.mlp", f"{CASES}:WrongSignature", r"WrongSignature'?: from_module\(original: nn.Module\) does "
     r"not fit from_module\(original: torch.nn.Module, path: str\)"),
    ("model.layers.*.mlp", f"{CASES}:RenamesWeights", r"the replacement of model.layers.0.mlp must keep its state "
     r"dict .*missing down_proj.weight, gate_proj.weight, up_proj.weight; extra down.weight, gate.weight, "
     r"up.weight"),
    ("model.layers.1.mlp", f"{CASES}:FailsToBuild", r"from_module failed on model.layers.1.mlp \(LlamaMLP\): "
     r"ValueError: this block needs a config field"),
])
def test_a_bad_spec_is_refused_at_check_with_its_path(tiny: Path, target: str, replace: str, message: str) -> None:
    with pytest.raises(PluginError, match=message) as info:
        _check(tiny, target, replace)
    assert isinstance(info.value, ModelSpecError)


def test_a_good_spec_checks_and_a_bad_router_score_is_refused(tiny: Path) -> None:
    _check(tiny, "model.layers.*.mlp", "examples.model_specs.plain_mlp:PlainMlp")      # the example passes
    cfg = load_config(EXAMPLE, {"model.path": str(tiny), "eval.data_source": None,
                                "model.router_scores": {"MyTopKRouter": f"{CASES}:missing_fn"}})
    with pytest.raises(PluginError, match=r"model.router_scores.MyTopKRouter '.*:missing_fn': module .* has no "
                                          r"attribute 'missing_fn'"):
        check_plugins(cfg)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"trainer.backend": "megatron"}, "model.specs are applied by the fsdp trainer backend"),
    ({"rollout.engine": "sglang"}, "model.specs are applied by the torch engine; rollout.engine is sglang"),
])
def test_a_backend_or_engine_that_would_ignore_specs_is_refused(overrides: dict[str, str], message: str) -> None:
    cfg = load_config(EXAMPLE, {**overrides, "model.specs": [
        {"target": "model.layers.*.mlp", "replace": "examples.model_specs.plain_mlp:PlainMlp"}]})
    with pytest.raises(ConfigError, match=message):
        check_trainer(cfg)
