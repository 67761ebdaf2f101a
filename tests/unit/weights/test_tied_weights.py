"""Tied weights are published once and loaded once: the FSDP backend's publish state leaves out lm_head.weight
(the embedding's alias) and names it in the manifest; a replica whose engine is tied the same way loads one tensor,
and one whose engine holds the alias separately gets the source copied there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from rlfleet.config import parse_config
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.weight_updates import WeightUpdater, default_receivers
from rlfleet.services.trainer.backends.fsdp import FsdpBackend
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.weight_sync.transports.bucketed import BucketedSender
from rlfleet.weights.tied import TIED_OPTION, decode_aliases, tied_aliases, with_aliases
from tests.support.tiny_model import make_tiny_model

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def test_tied_aliases_of_a_tied_model(tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "m"))
    assert tied_aliases(model) == {HEAD: EMBED}
    untied = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert tied_aliases(untied) == {}


def test_an_untied_engine_gets_the_source_copied_to_its_alias() -> None:
    embed = torch.randn(4, 3)
    got = with_aliases([(EMBED, embed)], f"{HEAD}={EMBED}", engine_aliases={})
    assert [n for n, _ in got] == [EMBED, HEAD] and got[1][1] is embed
    assert with_aliases([(EMBED, embed)], f"{HEAD}={EMBED}", engine_aliases={HEAD: EMBED}) == [(EMBED, embed)]
    with pytest.raises(ValueError, match="malformed entry 'lm_head.weight'"):
        decode_aliases("lm_head.weight")


def test_fsdp_publish_sends_the_tied_embedding_once_and_the_replica_loads_it(tmp_path: Path) -> None:
    trained, other = make_tiny_model(tmp_path / "a", seed=0), make_tiny_model(tmp_path / "b", seed=1)
    cfg = parse_config({"run": {"dir": str(tmp_path / "run")}, "model": {"path": str(trained)},
                        "rollout": {"data_source": "x:y", "reward_fn": "x:y"}})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    sender = BucketedSender("127.0.0.1:0", None, bucket_bytes=1 << 16)
    engine = TorchEngine(other, max_batch_size=2)
    try:
        backend = FsdpBackend(cfg, 0, 1, torch.device("cpu"))
        full = dict(backend.full_state_dict())
        manifest = sender.stage(1, 0, backend.sharded_state())
        manifest.options.update(backend.publish_options())
        names = [e.name for e in manifest.tensors]
        assert HEAD not in names and EMBED in names, "the publish sends the tied embedding once"
        assert torch.equal(full[HEAD], full[EMBED]), "the whole-model gather still names both"
        assert decode_aliases(manifest.options[TIED_OPTION]) == {HEAD: EMBED}
        reference = AutoModelForCausalLM.from_pretrained(trained)
        unique = {id(p): p for p in reference.parameters()}.values()
        assert manifest.total_bytes == sum(p.numel() * 4 for p in unique)       # each tensor's bytes once
        assert not torch.equal(dict(engine.named_weights())[HEAD], reference.lm_head.weight)
        result = WeightUpdater(engine, "r0", None, 30.0, receivers=default_receivers).apply(manifest)
        assert result.ok, result.error
        held = dict(engine.named_weights())
        for name, tensor in reference.state_dict().items():
            assert torch.equal(held[name], tensor), name
        assert held[HEAD].data_ptr() == held[EMBED].data_ptr()                  # still one tensor in the engine
    finally:
        engine.shutdown()
        sender.close()
        leave_distributed()
