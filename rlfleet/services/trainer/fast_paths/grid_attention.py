"""Padding-free shared-prompt forward: the projections, MLPs and norms run on the real tokens only, attention on the
padded grid of the shared layout.

The shared-prompt layout (shared_prompt.py) is a grid [R, L] of rows [prompt, response_1, ..., response_k, padding]
whose width is the longest row, so every token-wise op (q/k/v/o, gate/up/down, RMSNorm, rotary) also ran on the
padding: on the addition example's batches (32 families of a 7-token prompt and eight 2-5 token responses) about 13%
of the trainer's matmul FLOPs. Here the model is given the grid's real tokens as one packed row [1, T] (with the
grid's position ids) and a registered attention function, GRID_SDPA, gathers each layer's q, k, v [1, H, T, Dh] into
the grid [R, H, L, Dh], runs transformers' SDPA attention there with the layout's mask, and takes the real cells
back ([1, T, H, Dh]). Every token sees exactly the keys it saw in the padded grid, so logprobs and gradients equal the
padded layout's to float rounding; the gathers cost ~4 small copies a layer.

Padding cells read token 0 of the packed row: a padding query sees only padding keys and its output is dropped, and
no real query sees a padding key, so neither its values nor gradients reach a real token.

GRID_SDPA is registered with transformers' attention registry (`AttentionInterface`) with the SDPA mask builder. A
forward called without the GRID_KEY keyword argument (the padded fallback, evaluation, a checkpoint export) runs
plain SDPA attention, so switching a model to it (`use_grid_attention`) changes nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlfleet.services.trainer.fast_paths.attention_swap import swap_sdpa

GRID_SDPA = "rlfleet_grid_sdpa"
GRID_KEY = "rlfleet_grid"          # the forward's keyword argument that carries the Grid down to attention


@dataclass(frozen=True)
class Grid:
    """Where the packed tokens sit in the padded grid [rows, width]."""

    rows: int
    width: int
    source: torch.Tensor       # [rows * width] int64: the packed token of each grid cell (0 for padding cells)
    cells: torch.Tensor        # [T] int64: the grid cell (row * width + column) of each packed token

    @classmethod
    def of(cls, real: torch.Tensor) -> Grid:
        """real: [R, L] bool, the grid's real (non-padding) cells; packed order is row-major."""
        rows, width = real.shape
        flat = real.reshape(-1)                                                           # [R*L]
        cells = flat.nonzero().squeeze(1)                                                 # [T]
        source = torch.zeros(rows * width, dtype=torch.int64, device=real.device)       # [R*L]
        source[cells] = torch.arange(cells.numel(), device=real.device)
        return cls(rows=rows, width=width, source=source, cells=cells)

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """x: [1, H, T, Dh] packed -> [R, H, L, Dh] on the grid."""
        heads, dim = x.shape[1], x.shape[3]
        return x[0].index_select(1, self.source).view(heads, self.rows, self.width, dim).transpose(0, 1)

    def gather(self, out: torch.Tensor) -> torch.Tensor:
        """out: [R, L, H, Dh] on the grid -> [1, T, H, Dh], the real cells in packed order."""
        return out.reshape(self.rows * self.width, *out.shape[2:]).index_select(0, self.cells).unsqueeze(0)


def grid_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention; with kwargs[GRID_KEY] (a Grid) on the packed row's q [1, H, T, Dh] and k / v
    [1, Hkv, T, Dh] spread onto the grid, attention_mask the grid's [R, 1, L, L]. Returns ([1, T, H, Dh], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grid: Grid | None = kwargs.pop(GRID_KEY, None)
    if grid is None:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        return out, None
    out, _ = sdpa_attention_forward(module, grid.spread(query), grid.spread(key), grid.spread(value),
                                    attention_mask, **kwargs)                             # [R, L, H, Dh]
    return grid.gather(out), None


def use_grid_attention(model: Any) -> bool:
    """Switch a model that uses SDPA attention to GRID_SDPA; True if it was switched."""
    return swap_sdpa(model, GRID_SDPA, grid_sdpa)


def uses_grid_attention(model: Any) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == GRID_SDPA
