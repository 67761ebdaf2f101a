"""The lean Llama math's pieces (engines/lean_llama/llama_ops.py), by both libraries that can run its matmuls
(BlasLinears: torch's ops, feature-major; OneDNNLinears: oneDNN, at sizes that take it): the MLP block and the LM
head give the logits a plain row-major computation gives, checked against float64 references, and a decode step
over a vocabulary of several LM-head chunks matches the HF forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from rlfleet.cpu_kernels import onednn as onednn_linear
from rlfleet.services.rollout.engines.lean_llama.fused_params import LayerParams
from rlfleet.services.rollout.engines.lean_llama.llama_ops import LOGIT_CHUNK, BlasLinears, Linears, OneDNNLinears

ONEDNN = pytest.mark.skipif(not onednn_linear.usable(torch.device("cpu"), torch.float32),
                            reason="this torch build has no usable oneDNN linear")
LINEARS = [pytest.param(BlasLinears(), id="blas"), pytest.param(OneDNNLinears(), id="onednn", marks=ONEDNN)]

torch.set_num_threads(1)


def _mlp_params(hidden: int, inner: int, bias: bool, seed: int) -> LayerParams:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    return LayerParams(ln1=rand(hidden), qkv=rand(3 * hidden, hidden), qkv_bias=None, o=rand(hidden, hidden),
                       o_bias=None, ln2=1 + rand(hidden), gate_up=rand(2 * inner, hidden),
                       gate_up_bias=rand(2 * inner) if bias else None, down=rand(hidden, inner),
                       down_bias=rand(hidden) if bias else None)


@pytest.mark.parametrize("ops", LINEARS)
@pytest.mark.parametrize("bias", [False, True])
def test_mlp_block_equals_the_row_major_formula(bias: bool, ops: Linears) -> None:
    """x + down(silu(gate(n)) * up(n)), n = RMSNorm(x) * ln2, written out in float64 from the layer's weights (64
    rows, 128 -> 256: each matmul above onednn_linear.MIN_MACS)."""
    hidden, inner, eps = 128, 256, 1e-5
    assert 64 * hidden * inner >= onednn_linear.MIN_MACS
    p = _mlp_params(hidden, inner, bias, seed=3)
    x = torch.randn(64, hidden, generator=torch.Generator().manual_seed(4))              # [B, D]
    d = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in vars(p).items()}
    xd = x.double()
    n = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * d["ln2"]
    gate, up = n @ d["gate_up"][:inner].T, n @ d["gate_up"][inner:].T                    # [B, F] each
    if bias:
        gate, up = gate + d["gate_up_bias"][:inner], up + d["gate_up_bias"][inner:]
    want = xd + (gate * torch.sigmoid(gate) * up) @ d["down"].T
    if bias:
        want = want + d["down_bias"]
    got = ops.mlp_residual(x, p, eps)
    assert got.shape == (64, hidden) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("ops", LINEARS)
@pytest.mark.parametrize("bias", [False, True])
def test_lm_head_gives_every_vocabulary_entry_including_the_last_partial_chunk(bias: bool, ops: Linears) -> None:
    vocab, hidden = 2 * LOGIT_CHUNK + 37, 48
    head = nn.Linear(hidden, vocab, bias=bias)
    x = torch.randn(16, hidden)                                                         # [B, D]
    want = x.double() @ head.weight.double().T                                          # [B, V]
    if bias:
        want = want + head.bias.double()
    with torch.no_grad():
        got = ops.lm_head(x, head)
    assert got.shape == (16, vocab) and got.is_contiguous()
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=0)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize(("onednn", "rows", "hidden"), [pytest.param(False, 2, 32, id="blas"),
                                                       pytest.param(True, 40, 160, id="onednn", marks=ONEDNN)])
def test_decode_over_several_lm_head_chunks_matches_the_hf_forward(onednn: bool, rows: int, hidden: int) -> None:
    """A llama whose vocabulary spans three LM-head chunks: prefill and every decode step give the HF forward's
    last-token logits over the whole sequence. With oneDNN, 40 rows of width 160: q/k/v, gate/up, down and the LM
    head are above onednn_linear.MIN_MACS (oneDNN), the o projection below it (torch's op)."""
    from rlfleet.services.rollout.engines.lean_llama.fast_decode import FastDecoder

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2 * LOGIT_CHUNK + 300, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    if onednn:
        assert rows * (hidden + hidden) * hidden >= onednn_linear.MIN_MACS       # q/k/v: [(4 + 2·2)·Dh, D]
    g = torch.Generator().manual_seed(1)
    prompts = [[1, 2000, 5, 2100], [1, 7, 1500]] + \
        [[1, *torch.randint(3, cfg.vocab_size, (int(n),), generator=g).tolist()]
         for n in torch.randint(1, 6, (rows - 2,), generator=g)]
    with torch.inference_mode():
        dec = FastDecoder(model, onednn=onednn)
        assert isinstance(dec.ops, OneDNNLinears if onednn else BlasLinears)
        prefilled = dec.prefill(prompts, torch.arange(rows), 8)                        # logits: [R, V]
        cache, mask, logits = prefilled.cache, prefilled.mask, prefilled.logits
        seqs = [list(p) for p in prompts]
        pos = mask.sum(1)
        for _ in range(6):
            for row, seq in enumerate(seqs):
                want = model(torch.tensor([seq])).logits[0, -1]                             # [V]
                assert torch.allclose(logits[row], want, atol=1e-5, rtol=0)
            last = logits.argmax(-1)
            for seq, tok in zip(seqs, last.tolist(), strict=True):
                seq.append(tok)
            mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
            logits = dec.decode(cache, last, pos, mask, 8).logits
            pos = pos + 1


@pytest.mark.parametrize("ops", LINEARS)
def test_a_head_that_is_not_a_plain_linear_is_called_as_it_is(ops: Linears) -> None:
    """A wrapped or subclassed head (an adapter, a scale) keeps its own forward: its extra term is not dropped."""

    class ScaledHead(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    head = ScaledHead(16, 3 * LOGIT_CHUNK, bias=False)
    x = torch.randn(3, 16)
    with torch.no_grad():
        got = ops.lm_head(x, head)
    assert torch.allclose(got.double(), 2 * (x.double() @ head.weight.double().T), atol=1e-5, rtol=0)
