"""The torch engine's token choice (engines/sampling.py): exact inverse-CDF draws from the row's own uniform, the
logprob of log_softmax(logits / T), greedy = the first maximum, top-k/top-p honoured; references in float64 NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.services.rollout.engines.sampling import BLOCK, RowSampling, choose_tokens, first_argmax, inverse_cdf


def reference_pick(weights: np.ndarray, u: float) -> int:
    """The first id whose cumulative weight (float64) exceeds u x total."""
    cdf = np.cumsum(weights.astype(np.float64))
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


@pytest.mark.parametrize("vocab", [19, 4 * BLOCK - 1, 49152, 49152 + 77])   # plain cumsum; blocks; a partial block
def test_inverse_cdf_picks_where_the_uniform_falls(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    weights = torch.rand(64, vocab, generator=g) ** 8                  # uneven mass, like a softmax
    weights[:, ::7] = 0.0                                              # ids that must never be drawn
    u = torch.rand(64, 1, generator=g, dtype=torch.float32)
    picks = inverse_cdf(weights, u)
    w64 = weights.double().numpy()
    for row in range(64):
        want = reference_pick(w64[row], float(u[row]))
        got = int(picks[row])
        assert weights[row, got] > 0
        if got != want:         # float32 sums may move a boundary by rounding: then u sits at that boundary
            cdf = np.cumsum(w64[row])
            assert abs(cdf[min(got, want)] - float(u[row]) * cdf[-1]) <= 1e-5 * cdf[-1]


def test_draws_follow_the_softmax() -> None:
    """Over many uniforms the two-level draw reproduces the distribution (every id's frequency within 5 sigma)."""
    logits = torch.randn(1, 49152, generator=torch.Generator().manual_seed(0)) * 3
    probs = torch.softmax(logits.double(), -1)[0].numpy()
    weights = torch.exp(logits - logits.max()).expand(20000, -1)
    u = torch.rand(20000, 1, generator=torch.Generator().manual_seed(1))
    counts = np.bincount(inverse_cdf(weights, u).numpy(), minlength=49152)
    top = np.argsort(probs)[-20:]
    expected = probs[top] * 20000
    assert np.all(np.abs(counts[top] - expected) <= 5 * np.sqrt(expected) + 1)


def test_first_argmax_equals_torch_argmax_with_ties() -> None:
    x = torch.randn(8, 49152, generator=torch.Generator().manual_seed(2))
    x[0, 100] = x[0, 40000] = 50.0                                     # a tie in two blocks: the first wins
    x[1, 300] = x[1, 301] = 50.0                                       # a tie inside one block
    assert torch.equal(first_argmax(x), x.argmax(dim=-1))
    assert int(first_argmax(x)[0]) == 100 and int(first_argmax(x)[1]) == 300


def test_choose_tokens_logprobs_and_per_row_modes() -> None:
    vocab = 49152
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(3)) * 4
    rows = [RowSampling(0.0, 1.0, 0, None),                                   # greedy
            RowSampling(1.0, 1.0, 0, np.random.default_rng(10)),              # plain sampling
            RowSampling(0.7, 1.0, 0, np.random.default_rng(11)),              # temperature
            RowSampling(1.3, 1.0, 5, np.random.default_rng(12)),              # top-k
            RowSampling(1.0, 0.5, 0, np.random.default_rng(13)),              # top-p
            RowSampling(1.0, 1.0, 0, np.random.default_rng(14))]
    tokens, logprobs = choose_tokens(logits, rows)
    l64 = logits.double().numpy()
    for i, r in enumerate(rows):
        t = r.temperature if r.temperature > 0 else 1.0
        z = l64[i] / t
        logsm = z - (z.max() + np.log(np.exp(z - z.max()).sum()))           # log_softmax, float64
        assert abs(float(logprobs[i]) - logsm[int(tokens[i])]) < 1e-5
    assert int(tokens[0]) == int(np.argmax(l64[0]))
    for i in (1, 2, 5):                                                       # the row's own uniform, exact CDF
        u = np.random.default_rng(10 + i - 1 if i < 5 else 14).random()
        z = l64[i] / rows[i].temperature
        assert int(tokens[i]) == reference_pick(np.exp(z - z.max()), u)
    assert int(tokens[3]) in set(np.argsort(l64[3])[-5:].tolist())            # among the 5 largest
    z = l64[4]
    order = np.argsort(-z)
    p = np.exp(z[order] - z.max())
    p /= p.sum()
    nucleus = set(order[: int(np.searchsorted(np.cumsum(p), 0.5)) + 1].tolist())
    assert int(tokens[4]) in nucleus


def test_a_rows_draw_does_not_depend_on_the_batch() -> None:
    logits = torch.randn(5, 4096, generator=torch.Generator().manual_seed(4))
    alone, _ = choose_tokens(logits[2:3], [RowSampling(1.0, 1.0, 0, np.random.default_rng(7))])
    batch = [RowSampling(1.0, 1.0, 0, np.random.default_rng(s)) for s in (1, 2, 7, 3, 4)]
    together, _ = choose_tokens(logits, batch)
    assert int(together[2]) == int(alone[0])


def test_exact_logprobs_are_log_softmax_bitwise() -> None:
    """On-policy mode asks for logprobs taken by torch.log_softmax itself, to match a recomputation bitwise."""
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(5))
    rows = [RowSampling(0.8, 1.0, 0, np.random.default_rng(i)) for i in range(4)]
    tokens, logprobs = choose_tokens(logits, rows, exact_logprobs=True)
    want = torch.log_softmax(logits / 0.8, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    assert torch.equal(logprobs, want)
