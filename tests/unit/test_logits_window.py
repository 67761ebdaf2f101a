"""The trainer's LM head runs only from the shortest prompt's last token on (rlfleet/services/trainer/logits_window.py),
and the response logprobs and their gradients equal those read from the full forward's logits, padded and shared."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.protocols import TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.trainer.batch import build_train_batch, first_read_position, forward_logprobs
from rlfleet.services.trainer.fast_paths.shared_prompt import plan, shared_forward_logprobs
from rlfleet.services.trainer.logits_window import logits_window
from tests.support.tiny_model import make_tiny_model

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    torch.set_num_threads(1)
    path = make_tiny_model(tmp_path_factory.mktemp("window") / "model")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _batch() -> TrainBatch:
    """Two groups with long prompts (9 and 13 tokens) and short responses (0-4 tokens)."""
    g = torch.Generator().manual_seed(1)
    samples = []
    for gi, plen in enumerate((9, 13)):
        prompt = [1, *torch.randint(3, 19, (plen - 1,), generator=g).tolist()]
        for i in range(3):
            t = (gi + i * 2) % 5
            samples.append(Sample(group_id=f"g{gi}", index=i, group_size=3, prompt_ids=prompt,
                                  response_ids=torch.randint(3, 19, (t,), generator=g).tolist(),
                                  rollout_logprobs=[-1.0] * t, loss_mask=[1] * t, reward=float(i)))
    return build_train_batch(samples)


def reference_logprobs(model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
    """Response-token logprobs [S, T] from the full forward's logits, gathered here position by position."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logp = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)                          # [S, L, V]
    s, t = batch.response_mask.shape
    out = torch.zeros(s, t)
    for row in range(s):
        start = int(batch.response_start[row])
        for j in range(t):
            if batch.response_mask[row, j]:
                pos = start + j
                out[row, j] = logp[row, pos - 1, batch.input_ids[row, pos]]
    return out


def test_the_window_starts_at_the_shortest_prompts_last_token(model: torch.nn.Module) -> None:
    batch = _batch()
    assert first_read_position(batch) == 8                       # the 9-token prompt's last token
    first, keep = logits_window(model, batch.input_ids.shape[1], first_read_position(batch))
    assert (first, keep) == (8, {"logits_to_keep": batch.input_ids.shape[1] - 8})
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **keep)
    assert out.logits.shape[1] == batch.input_ids.shape[1] - 8   # the head ran on the window only


def test_windowed_logprobs_and_gradients_equal_the_full_forwards(model: torch.nn.Module) -> None:
    batch = _batch()
    mask = batch.response_mask.bool()
    params = [p for p in model.parameters() if p.requires_grad]

    rows = plan(batch, 256)
    assert rows is not None                                       # the shared layout saves tokens on this batch
    want = reference_logprobs(model, batch)
    want_grads = torch.autograd.grad(want[mask].sum(), params)
    for name, got in (("padded", forward_logprobs(model, batch, TEMPERATURE)),
                      ("shared", shared_forward_logprobs(model, batch, TEMPERATURE, rows, 0,
                                                         torch.float32))):
        assert torch.allclose(got[mask], want[mask], atol=1e-5, rtol=0), (name, (got - want)[mask].abs().max())
        grads = torch.autograd.grad(got[mask].sum(), params)
        for g, w in zip(grads, want_grads, strict=True):
            assert torch.allclose(g, w, atol=1e-5, rtol=1e-4), (name, (g - w).abs().max())


def test_a_forward_without_logits_to_keep_gets_every_position() -> None:
    class Plain(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return input_ids

    assert logits_window(Plain(), 20, 8) == (0, {})
