"""The trainer's module swap onto oneDNN linears (services/trainer/fast_paths/onednn_linears.py): the swap keeps
parameters, ties and names, and a device or dtype oneDNN cannot take is left to torch's own ops."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlfleet.cpu_kernels import onednn as onednn_linear
from rlfleet.services.trainer.fast_paths.onednn_linears import OneDNNLinear, use_onednn_linears

pytestmark = pytest.mark.skipif(not onednn_linear.usable(torch.device("cpu"), torch.float32),
                                reason="this torch build has no usable oneDNN linear")


def test_the_swap_keeps_parameters_ties_names_and_the_model_output() -> None:
    """Every plain nn.Linear becomes a OneDNNLinear on the same Parameter objects: a tied head stays tied, the
    state dict has the same names, and the model computes what it did (to rounding); a Linear subclass is left."""

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 64), nn.Linear(64, 128), nn.SiLU(), Scaled(128, 64), nn.Linear(64, 50))
    model[4].weight = model[0].weight                                                        # tied head
    params = {name: id(p) for name, p in model.named_parameters()}
    names = list(model.state_dict())
    ids = torch.randint(0, 50, (4, 90))
    with torch.no_grad():
        before = model(ids)
    assert use_onednn_linears(model, torch.device("cpu"), torch.float32) == 2
    assert isinstance(model[1], OneDNNLinear) and isinstance(model[4], OneDNNLinear) and type(model[3]) is Scaled
    assert {name: id(p) for name, p in model.named_parameters()} == params
    assert model[4].weight is model[0].weight and list(model.state_dict()) == names
    with torch.no_grad():
        after = model(ids)
    assert torch.allclose(after, before, atol=1e-5, rtol=0)


def test_devices_and_dtypes_onednn_cannot_take_keep_torch_ops() -> None:
    assert not onednn_linear.usable(torch.device("meta"), torch.float32)
    assert not onednn_linear.usable(torch.device("cpu"), torch.float64)
    model = nn.Sequential(nn.Linear(8, 8)).double()
    assert use_onednn_linears(model, torch.device("cpu"), torch.float64) == 0 and type(model[0]) is nn.Linear
    assert use_onednn_linears(model, torch.device("meta"), torch.float32) == 0 and type(model[0]) is nn.Linear
