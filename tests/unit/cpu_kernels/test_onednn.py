"""oneDNN linears (rlfleet/cpu_kernels/onednn.py): results and gradients equal float64 references on both sides of
MIN_MACS. The trainer's module swap onto them is tested in tests/unit/trainer_fast_paths/test_onednn_linears.py."""

from __future__ import annotations

import pytest
import torch

from rlfleet.cpu_kernels import onednn as onednn_linear

pytestmark = pytest.mark.skipif(not onednn_linear.usable(torch.device("cpu"), torch.float32),
                                reason="this torch build has no usable oneDNN linear")

# (rows, in, out): above MIN_MACS (oneDNN) and below it (torch's op); biased and not
SHAPES = [pytest.param(300, 96, 160, id="onednn"), pytest.param(3, 24, 40, id="small")]


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("rows", "k", "n"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_and_linear_add_equal_float64_references(rows: int, k: int, n: int, bias: bool) -> None:
    x, w, other = _rand(rows, k, seed=1), _rand(n, k, seed=2) * 0.1, _rand(rows, n, seed=3)
    b = _rand(n, seed=4) if bias else None
    want = x.double() @ w.double().T + (b.double() if b is not None else 0)                 # [rows, n]
    assert (rows * n * k >= onednn_linear.MIN_MACS) == (rows == 300)
    got = onednn_linear.linear(x, w, b)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=0)
    got_add = onednn_linear.linear_add(x, other, w, b)
    assert torch.allclose(got_add.double(), want + other.double(), atol=1e-5, rtol=0)
    strided = onednn_linear.linear(x.t().contiguous().t(), w, b)                              # a transposed view
    assert torch.allclose(strided.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("rows", "k", "n"), SHAPES)
def test_gradients_equal_float64_autograd(rows: int, k: int, n: int) -> None:
    """dx, dW and db of linear_autograd against torch autograd of F.linear in float64, for x [2, rows, K]."""
    x = _rand(2, rows, k, seed=5)
    w, b = _rand(n, k, seed=6) * 0.1, _rand(n, seed=7)
    dy = _rand(2, rows, n, seed=8)
    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
    out = onednn_linear.linear_autograd(xs, ws, bs)
    assert out.shape == (2, rows, n)
    out.backward(dy)
    xd, wd, bd = (t.double().requires_grad_(True) for t in (x, w, b))
    torch.nn.functional.linear(xd, wd, bd).backward(dy.double())
    for got, want in ((out, torch.nn.functional.linear(x.double(), w.double(), b.double())), (xs.grad, xd.grad),
                      (ws.grad, wd.grad), (bs.grad, bd.grad)):
        assert got is not None and want is not None
        scale = float(want.abs().max())
        assert torch.allclose(got.double(), want, atol=2e-6 * scale, rtol=0)
