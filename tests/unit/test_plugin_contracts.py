"""Every plug point is checked against its Protocol's own signature: `rlfleet check` (preflight.check_plugins)
refuses a plugin whose call does not fit, naming the field, the path, the Protocol and its call; a fitting plugin
passes; and the check follows the Protocol (a local Protocol with another signature changes what is accepted)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import pytest

from rlfleet.config import load_config
from rlfleet.local.preflight import check_plugins
from rlfleet.plugins import PluginError, load_callable

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition" / "config.yaml"

PLUGINS = '''
def reward_ok(prompt, completion, sample, answer):      # `answer`: a dataset column, passed by keyword
    return 1.0
def reward_bad(prompt, completion):
    return 1.0
def rollout_ok(ctx, prompt, ticket):
    return iter(())
def rollout_bad(ctx, prompt):
    return iter(())
def filter_ok(group):
    return None
def filter_bad():
    return None
def advantage_ok(batch):
    return batch
def advantage_bad(batch, extra):
    return batch
def loss_ok(logprobs, advantages, batch, token_count):
    return None
def loss_bad(logprobs, advantages, batch):
    return None
def prepare_ok(model_dir, seed):
    pass
def prepare_bad(model_dir):
    pass
class HooksOk:
    def before_step(self, step, batch):
        pass
class HooksBad:
    def before_step(self, step):
        pass
'''

# field, override value that fits, value that does not, the Protocol's call as the error must show it (hand-written)
CASES = [
    ("rollout.reward_fn", "contract_plugins:reward_ok", "contract_plugins:reward_bad",
     "RewardFn(prompt: Prompt, completion: str, sample: Sample)"),
    ("rollout.rollout_fn", "contract_plugins:rollout_ok", "contract_plugins:rollout_bad",
     "RolloutFn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket)"),
    ("buffer.filters", ["contract_plugins:filter_ok"], ["contract_plugins:filter_bad"],
     "SampleFilter(group: Sequence[Sample])"),
    ("trainer.advantage", "contract_plugins:advantage_ok", "contract_plugins:advantage_bad",
     "AdvantageEstimator(batch: TrainBatch)"),
    ("trainer.loss", "contract_plugins:loss_ok", "contract_plugins:loss_bad",
     "LossFn(logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch, token_count: float)"),
    ("model.prepare", "contract_plugins:prepare_ok", "contract_plugins:prepare_bad",
     "ModelPrepareFn(model_dir: str, seed: int)"),
    ("trainer.hooks", ["contract_plugins:HooksOk"], ["contract_plugins:HooksBad"],
     "TrainerHooks.before_step(step: int, batch: TrainBatch)"),
]


@pytest.fixture
def plugins_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "contract_plugins.py").write_text(PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("field, good, bad, contract", CASES, ids=[c[0] for c in CASES])
def test_each_contract_is_checked_from_its_protocol(plugins_on_path: None, field: str, good: object, bad: object,
                                                    contract: str) -> None:
    check_plugins(load_config(EXAMPLE, {field: good}))
    with pytest.raises(PluginError) as info:
        check_plugins(load_config(EXAMPLE, {field: bad}))
    message = str(info.value)
    bad_path = bad[0] if isinstance(bad, list) else bad
    assert message.startswith(f"{field} '{bad_path}': signature ("), message
    assert f"does not fit {contract}" in message, message


class TwoArgs(Protocol):
    def __call__(self, a: int, b: str) -> None: ...


class ThreeArgs(Protocol):
    def __call__(self, a: int, b: str, c: float) -> None: ...


class OneAndKey(Protocol):
    def __call__(self, a: int, *, key: str) -> None: ...


def two(a: int, b: str) -> None:
    pass


def one_and_key(a: int, key: str) -> None:
    pass


def test_the_check_follows_the_protocol() -> None:
    assert load_callable("tests.unit.test_plugin_contracts:two", "my.field", TwoArgs) is two
    with pytest.raises(PluginError, match=r"^my\.field 'tests\.unit\.test_plugin_contracts:two': signature \(a: int, "
                                          r"b: str\) does not fit ThreeArgs\(a: int, b: str, c: float\)"):
        load_callable("tests.unit.test_plugin_contracts:two", "my.field", ThreeArgs)
    assert load_callable("tests.unit.test_plugin_contracts:one_and_key", "f", OneAndKey) is one_and_key
    with pytest.raises(PluginError, match=r"does not fit OneAndKey\(a: int, \*, key: str\)"):
        load_callable("tests.unit.test_plugin_contracts:two", "f", OneAndKey)


def test_builtins_without_a_signature_are_trusted() -> None:
    assert load_callable("builtins:print", "f", ThreeArgs) is print
