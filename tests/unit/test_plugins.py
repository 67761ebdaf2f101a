"""Plugins load by dotted path; import failures and wrong signatures are reported with the plugin's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.config import load_config
from rlfleet.local.preflight import check_plugins
from rlfleet.plugins import PluginError, load_callable, load_factory, load_hooks
from rlfleet.protocols import RewardFn
from rlfleet.rewards.scorer import resolve_reward

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "addition" / "config.yaml"


def test_loads_example_reward() -> None:
    fn = resolve_reward("examples.addition.reward:exact_match", {}, "rollout.reward_fn")
    from examples.addition.data import train_prompts

    p = train_prompts()[0]
    assert fn(p, p.label, None) == 1.0 and fn(p, "x", None) == 0.0


@pytest.mark.parametrize("path, expected", [
    ("examples.addition.rewardz:exact_match", "module 'examples.addition.rewardz' could not be imported"),
    ("examples.addition.reward:exact", "has no attribute 'exact'"),
    ("examples.addition.reward", "expected 'package.module:attribute'"),
    ("examples.addition.data:_ALL", "is not callable"),
    ("examples.addition.data:train_prompts", "does not fit RewardFn(prompt: Prompt, completion: str, sample: Sample)"),
])
def test_reward_plugin_errors(path: str, expected: str) -> None:
    with pytest.raises(PluginError) as info:
        load_callable(path, "rollout.reward_fn", RewardFn)
    assert expected in str(info.value) and path in str(info.value) and "reward_fn" in str(info.value)


def test_module_that_raises_on_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_plugin.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="ModuleNotFoundError: No module named 'does_not_exist_anywhere'"):
        load_callable("broken_plugin:f", "rollout.reward_fn", RewardFn)


def test_factory_keyword_errors() -> None:
    with pytest.raises(PluginError, match="do not fit"):
        load_factory("examples.addition.data:train_prompts", "data_source", {"seeed": 1})
    assert len(load_factory("examples.addition.data:train_prompts", "data_source", {"seed": 1})) == 9500


def test_hooks_must_implement_something(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_hooks.py").write_text(
        "class Good:\n    def before_step(self, step, batch):\n        pass\n\nclass Empty:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert len(load_hooks(["my_hooks:Good"])) == 1
    with pytest.raises(PluginError, match="implements none of"):
        load_hooks(["my_hooks:Empty"])


def test_preflight_names_the_broken_plugin() -> None:
    cfg = load_config(EXAMPLE, {"rollout.reward_fn": "examples.addition.nope:exact_match"})
    with pytest.raises(PluginError, match="examples.addition.nope"):
        check_plugins(cfg)
