"""The example spec (examples/model_specs/plain_mlp.py, every layer's MLP in plain torch) applied where a run applies
it: the FSDP trainer's backend and the torch engine. Each runs the replacement (its forward is called: the trainer's
module swaps and the engine's lean decode step aside) and its logprobs equal the unmodified HF model's, computed here
from its logits, to float32 rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from examples.model_specs.plain_mlp import PlainMlp
from rlfleet.config import ModuleSpecConfig, load_config
from rlfleet.model_specs import load_specs
from rlfleet.protocols import SamplingParams
from rlfleet.sample import Sample
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.trainer.backends.fsdp import FsdpBackend
from rlfleet.services.trainer.batch import build_train_batch
from rlfleet.services.trainer.fast_paths import apply_model_swaps
from tests.support.runs import EXAMPLE
from tests.support.tiny_model import make_tiny_model

SPEC = {"target": "model.layers.*.mlp", "replace": "examples.model_specs.plain_mlp:PlainMlp"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", seed=4)


def _reference(tiny: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()


def _count_calls(model: torch.nn.Module) -> list[int]:
    calls = [0]
    for module in model.modules():
        if isinstance(module, PlainMlp):
            module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_trainer_forward_runs_the_spec_and_matches_the_original(tiny: Path, tmp_path: Path,
                                                                 gloo_world: None) -> None:
    cfg = load_config(EXAMPLE, {"model.path": str(tiny), "eval.data_source": None, "run.dir": str(tmp_path),
                                "model.specs": [SPEC]})
    backend = FsdpBackend(cfg, 0, 1, torch.device("cpu"))
    assert [a.paths for a in backend.model_specs] == [("model.layers.0.mlp", "model.layers.1.mlp")]
    assert apply_model_swaps(_reference(tiny), cfg, torch.device("cpu"), torch.float32) == []   # the spec wins
    calls = _count_calls(backend.model)
    prompt = [1, 5, 7, 2, 9]
    samples = [Sample(group_id="g", index=i, group_size=3, prompt_ids=prompt, response_ids=resp,
                      rollout_logprobs=[0.0] * len(resp))
               for i, resp in enumerate([[3, 4, 11], [6, 6], [12, 8, 3, 4]])]       # one group: a shared prompt
    batch = build_train_batch(samples, pad_id=backend.pad_id)
    with torch.no_grad():
        got = backend._forward(backend.model, batch, 1.0)                          # [S, T] the trainer's forward
        logits = _reference(tiny)(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [S, L, V]
    assert calls[0] > 0
    logp = torch.log_softmax(logits.float(), -1)
    for s, sample in enumerate(samples):
        start = int(batch.response_start[s])
        want = [float(logp[s, start + t - 1, tok]) for t, tok in enumerate(sample.response_ids)]
        torch.testing.assert_close(got[s, :len(want)], torch.tensor(want), atol=1e-5, rtol=0)


def test_engine_decode_runs_the_spec_and_matches_the_original(tiny: Path) -> None:
    specs = load_specs([ModuleSpecConfig(**SPEC)])
    engine = TorchEngine(tiny, max_batch_size=4, seed=0, model_specs=specs)       # fast_decode on: the spec wins
    try:
        calls = engine.call(lambda: _count_calls(engine.model))
        prompts = [[1, 2, 3, 4], [5, 6]]
        futures = [engine.submit(p, SamplingParams(temperature=1.0, max_new_tokens=8, seed=3 + i))
                   for i, p in enumerate(prompts)]
        gens = [f.result(timeout=60) for f in futures]
    finally:
        engine.shutdown()
    assert calls[0] > 0
    reference = _reference(tiny)
    for prompt, gen in zip(prompts, gens, strict=True):
        full = torch.tensor([prompt + list(gen.output_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(reference(input_ids=full).logits[0].float(), -1)     # [L, V]
        want = [float(logp[len(prompt) + t - 1, tok]) for t, tok in enumerate(gen.output_ids)]
        torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(want), atol=1e-5, rtol=0)
