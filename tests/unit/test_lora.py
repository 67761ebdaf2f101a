"""LoRA: the trainer's adapter module trains adapters only and starts equal to the base model; the rollout side
merges W + alpha/r * B @ A onto the kept base weights, through the weight updater's adapter-only path."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import cast

import pytest
import torch

from rlfleet.services.rollout.engines.base import Engine, EngineError
from rlfleet.services.rollout.engines.lora import LoraMerger
from rlfleet.services.rollout.weight_updates import WeightUpdater
from rlfleet.services.trainer.lora import LoraLinear, apply_lora, is_adapter, merge_adapters
from rlfleet.services.weight_sync.transports.manifest import digest_of, tensor_xxh64
from rlfleet.v1 import weights_pb2
from rlfleet.weights.dtypes import dtype_name
from rlfleet.weights.tied import tied_aliases
from tests.support.tiny_model import make_tiny_model

TARGETS = ["q_proj", "v_proj"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_model(tmp_path_factory.mktemp("lora") / "model")


def _model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def _ids() -> torch.Tensor:
    return torch.tensor([[1, 5, 14, 5, 15, 6, 2], [1, 7, 14, 8, 15, 3, 4]])


def test_adapters_only_train_and_start_at_the_base_model(model_dir: Path) -> None:
    base, model = _model(model_dir), _model(model_dir)
    replaced = apply_lora(model, rank=4, alpha=8.0, targets=TARGETS, seed=3)
    assert len(replaced) == 2 * 2 and all(n.rsplit(".", 1)[-1] in TARGETS for n in replaced)   # 2 layers
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable and all(is_adapter(n) for n in trainable)
    names = set(model.state_dict())
    assert set(base.state_dict()) <= names                       # base names unchanged: publish/convert rely on it
    with torch.no_grad():
        torch.testing.assert_close(model(_ids()).logits, base(_ids()).logits, atol=0, rtol=0)
    again = _model(model_dir)
    apply_lora(again, rank=4, alpha=8.0, targets=TARGETS, seed=3)
    assert all(torch.equal(again.state_dict()[n], model.state_dict()[n]) for n in trainable)   # same on every rank
    with pytest.raises(ValueError, match="no nn.Linear"):
        apply_lora(_model(model_dir), 2, 4.0, ["nope"], seed=0)


def _randomize_adapters(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoraLinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.3)


def test_merged_weights_reproduce_the_adapted_model(model_dir: Path) -> None:
    model = _model(model_dir)
    apply_lora(model, rank=4, alpha=8.0, targets=TARGETS, seed=0)
    _randomize_adapters(model)
    merged = _model(model_dir)
    merged.load_state_dict(merge_adapters(model.state_dict(), 8.0 / 4))
    with torch.no_grad():
        torch.testing.assert_close(merged(_ids()).logits, model(_ids()).logits, atol=1e-5, rtol=0)


class FakeEngine:
    """A WeightLoadTarget over a real HF model, like the torch engine. Not Pausable: WeightUpdater loads it
    unpaused."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.weight_version, self.loads = model, 0, 0

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return list(self.model.state_dict().items())

    def tied_aliases(self) -> dict[str, str]:
        return tied_aliases(self.model)

    def update_weights_from_tensor(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        params = self.model.state_dict()
        with torch.no_grad():
            for name, t in named:
                params[name].copy_(t)
        self.weight_version, self.loads = version, self.loads + 1


def _adapter_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, t.detach().clone()) for n, t in model.state_dict().items() if is_adapter(n)]


def _manifest(version: int, tensors: list[tuple[str, torch.Tensor]]) -> weights_pb2.WeightManifest:
    m = weights_pb2.WeightManifest(version=version, transport="test", adapter_only=True, digest=digest_of(tensors),
                                   options={"rank": "4", "alpha": "8.0", "targets": ",".join(TARGETS)})
    for name, t in tensors:
        m.tensors.add(name=name, dtype=dtype_name(t.dtype), shape=list(t.shape), xxh64=tensor_xxh64(t))
    return m


def test_rollout_merges_adapter_versions_onto_the_kept_base(model_dir: Path) -> None:
    trainer = _model(model_dir)
    apply_lora(trainer, rank=4, alpha=8.0, targets=TARGETS, seed=0)
    engine = FakeEngine(_model(model_dir))
    base_q = engine.model.state_dict()["model.layers.0.self_attn.q_proj.weight"].clone()
    sent: dict[int, list] = {}
    updater = WeightUpdater(engine, "r0", None, 5.0, receivers=lambda transport: (
        lambda manifest, token, timeout, replica: sent[manifest.version]))
    for version in (1, 2):                                       # two adapter versions: merged onto the base each time
        _randomize_adapters(trainer) if version == 1 else _scale_b(trainer, 2.0)
        sent[version] = _adapter_tensors(trainer)
        result = updater.apply(_manifest(version, sent[version]))
        assert result.ok, result.error
        assert result.digest == digest_of(sent[version]) and engine.weight_version == version
        with torch.no_grad():
            torch.testing.assert_close(engine.model(_ids()).logits, trainer(_ids()).logits, atol=1e-5, rtol=0)
    a = dict(sent[2])["model.layers.0.self_attn.q_proj.lora_A"]
    b = dict(sent[2])["model.layers.0.self_attn.q_proj.lora_B"]
    torch.testing.assert_close(engine.model.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                               base_q + 2.0 * b @ a, atol=1e-6, rtol=0)
    assert engine.model.state_dict()["model.layers.0.mlp.up_proj.weight"].equal(
        _model(model_dir).state_dict()["model.layers.0.mlp.up_proj.weight"])           # untouched


def _scale_b(model: torch.nn.Module, factor: float) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoraLinear):
                m.lora_B.mul_(factor)


def test_bad_adapter_updates_are_refused(model_dir: Path) -> None:
    merger = LoraMerger(cast(Engine, FakeEngine(_model(model_dir))))
    a = torch.zeros(4, 32)
    with pytest.raises(EngineError, match="rank/alpha"):
        merger.merged([("x.lora_A", a)], {})
    with pytest.raises(EngineError, match="without lora_B"):
        merger.merged([("model.layers.0.self_attn.q_proj.lora_A", a)], {"rank": "4", "alpha": "8"})
    with pytest.raises(EngineError, match="non-adapter"):
        merger.merged([("model.norm.weight", torch.zeros(32))], {"rank": "4", "alpha": "8"})
    with pytest.raises(EngineError, match="do not fit"):
        merger.merged([("model.layers.0.self_attn.q_proj.lora_A", torch.zeros(2, 32)),
                       ("model.layers.0.self_attn.q_proj.lora_B", torch.zeros(32, 2))], {"rank": "4", "alpha": "8"})
