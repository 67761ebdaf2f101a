"""Shared-prompt forward: samples with the same prompt (a GRPO group) run that prompt through the model once.

Layout. Rows of the padded batch whose prompt tokens are equal form a family. Each family becomes one or more
rows of the form [prompt, response_1, ..., response_k, padding]: position ids run 0..P-1 over the prompt and
restart at P for every response, and a 4D mask lets each response see the prompt and itself (causally) but no other
response. A response token's hidden state is then the one it has in its own padded row [prompt, response], so its
logprob is the same to float rounding, and the prompt's P tokens are computed once instead of k times.

For group size 8, a 7-token prompt and 5-token responses this is 47 tokens instead of 8 x 12 = 96; for few-shot
chat prompts of hundreds of tokens the saving approaches the group size. Rows hold at most `max_tokens` tokens (a
family that does not fit is split, each part repeating the prompt), so the [R, 1, L, L] mask stays small.

The layout is used only where it saves tokens (`plan` returns None otherwise: every prompt unique, or any prompt
empty). `SharedPromptForward` checks once, on the first batch it lays out, that the model honours the mask and
position ids (logprobs equal the padded forward's); a model that does not is run padded from then on, with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from rlfleet.protocols import TrainBatch
from rlfleet.services.trainer.batch import select_rows
from rlfleet.services.trainer.entropy import record_entropy
from rlfleet.services.trainer.fast_paths.grid_attention import GRID_KEY, Grid, uses_grid_attention
from rlfleet.services.trainer.logits_window import logits_window, takes_logits_to_keep
from rlfleet.services.trainer.step import ForwardFn

log = logging.getLogger(__name__)

MIN_SAVING = 0.9          # lay out shared only when it needs at most this fraction of the padded tokens
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}


@dataclass(frozen=True)
class SharedLayout:
    input_ids: torch.Tensor       # [R, L] int64
    position_ids: torch.Tensor    # [R, L] int64: 0..P-1 over the prompt, P.. again for each response
    segment: torch.Tensor         # [R, L] int64: 0 the prompt, k >= 1 the k-th response of the row, -1 padding
    row: torch.Tensor             # [S] int64: the layout row of each batch row
    prompt_last: torch.Tensor     # [S] int64: index in its row of the prompt's last token
    offset: torch.Tensor          # [S] int64: index in its row of the sample's first response token


def _families(batch: TrainBatch) -> tuple[list[list[int]], list[int], list[int]]:
    """Batch rows grouped by equal prompt tokens (first appearance order), and each row's prompt / total length."""
    starts = [int(v) for v in batch.response_start.tolist()]                        # [S]
    lengths = [int(v) for v in batch.attention_mask.sum(1).tolist()]                # [S]
    ids = batch.input_ids.cpu()
    families: dict[bytes, list[int]] = {}
    for i, p in enumerate(starts):
        families.setdefault(ids[i, :p].numpy().tobytes(), []).append(i)
    return list(families.values()), starts, lengths


def plan(batch: TrainBatch, max_tokens: int) -> list[list[int]] | None:
    """Batch rows of each layout row (members share their prompt), or None where sharing does not pay."""
    s = batch.input_ids.shape[0]
    if s == 0 or batch.response_mask.shape[1] == 0:
        return None
    families, starts, lengths = _families(batch)
    if len(families) == s or min(starts) == 0:
        return None
    rows: list[list[int]] = []
    shared_tokens = 0
    for fam in families:
        p = starts[fam[0]]
        row: list[int] = []
        used = p
        for i in fam:
            r = lengths[i] - p
            if row and used + r > max_tokens:
                rows.append(row)
                shared_tokens += used
                row, used = [], p
            row.append(i)
            used += r
        rows.append(row)
        shared_tokens += used
    padded_tokens = s * batch.input_ids.shape[1]
    return rows if shared_tokens <= MIN_SAVING * padded_tokens else None


def lay_out(batch: TrainBatch, rows: list[list[int]], pad_id: int = 0) -> SharedLayout:
    """The layout tensors for `plan`'s rows. Vectorised: every token's source (batch row, column) and destination
    (layout row, column) are computed as numpy index arrays and copied at once."""
    ids_in = batch.input_ids.cpu().numpy()                                                # [S, L0]
    starts = batch.response_start.cpu().numpy().astype(np.int64)                          # [S]
    resp = batch.attention_mask.sum(1).cpu().numpy().astype(np.int64) - starts            # [S] response lengths
    s, n_rows = ids_in.shape[0], len(rows)
    members = np.array([i for r in rows for i in r], dtype=np.int64)                       # [S] in layout order
    row_of_m: np.ndarray = np.repeat(np.arange(n_rows), [len(r) for r in rows])                       # [S] layout row
    first = np.array([r[0] for r in rows], dtype=np.int64)                                 # [R] prompt source
    p_row = starts[first]                                                                  # [R] prompt lengths
    lens = resp[members]                                                                   # [S]
    ends = np.cumsum(lens)                                                                 # inclusive, global
    row_first = np.asarray(np.searchsorted(row_of_m, np.arange(n_rows)))                   # [R] its first member
    before = ends - lens                                                                   # exclusive, global
    offset_m = p_row[row_of_m] + before - before[row_first][row_of_m]                      # [S] in its row
    rank_m = np.arange(len(members)) - row_first[row_of_m] + 1                             # [S] 1..k in its row
    used = p_row + np.bincount(row_of_m, weights=lens, minlength=n_rows).astype(np.int64)  # [R] tokens in row
    width = max(int(used.max(initial=1)), 1)
    ids: np.ndarray = np.full((n_rows, width), pad_id, dtype=np.int64)                                 # [R, L]
    seg: np.ndarray = np.full((n_rows, width), -1, dtype=np.int64)                                     # [R, L]
    pos = np.tile(np.arange(width, dtype=np.int64), (n_rows, 1))                           # [R, L] padding: own block
    # prompts: row r, columns 0..p-1 from batch row first[r]
    pr: np.ndarray = np.repeat(np.arange(n_rows), p_row)                                               # [sum p]
    pc = np.arange(len(pr)) - np.repeat(np.cumsum(p_row) - p_row, p_row)                   # [sum p]
    ids[pr, pc], seg[pr, pc] = ids_in[first[pr], pc], 0
    # responses: token j of member m at (row_of_m, offset_m + j), from (members[m], starts + j), position p + j
    tm: np.ndarray = np.repeat(np.arange(len(members)), lens)                              # [N] member of token
    tj = np.arange(len(tm)) - np.repeat(before, lens)                                      # [N] index in response
    src = members[tm]
    ids[row_of_m[tm], offset_m[tm] + tj] = ids_in[src, starts[src] + tj]
    pos[row_of_m[tm], offset_m[tm] + tj] = p_row[row_of_m[tm]] + tj
    seg[row_of_m[tm], offset_m[tm] + tj] = rank_m[tm]
    # padding after a row's last response: positions restart at 0 there (a block of its own)
    pad = np.arange(width)[None, :] >= used[:, None]                                       # [R, L]
    pos[pad] = (np.arange(width)[None, :] - used[:, None])[pad]
    row_of, prompt_last, offset = (np.zeros(s, dtype=np.int64) for _ in range(3))          # [S] each
    row_of[members], prompt_last[members], offset[members] = row_of_m, p_row[row_of_m] - 1, offset_m
    dev = batch.input_ids.device
    t = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
    return SharedLayout(input_ids=t(ids), position_ids=t(pos), segment=t(seg), row=t(row_of),
                        prompt_last=t(prompt_last), offset=t(offset))


def shared_mask(segment: torch.Tensor) -> torch.Tensor:
    """segment [R, L] -> allowed [R, 1, L, L] bool: query i sees key j <= i of its own segment, and a response
    query (segment >= 1) also sees its row's prompt (segment 0). Padding (-1) sees only padding."""
    length = segment.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment.device).tril()     # [L, L]
    q, k = segment[:, :, None], segment[:, None, :]                                          # [R, L, 1], [R, 1, L]
    allowed = ((q == k) | ((k == 0) & (q >= 1))) & causal[None]                              # [R, L, L]
    return allowed[:, None]                                                                  # [R, 1, L, L]


def attention_mask_for(model: torch.nn.Module, allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 4D mask in the form the model's attention takes: additive (0 / dtype min) for eager, bool otherwise."""
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attn != "eager":
        return allowed
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return blocked.masked_fill_(~allowed, torch.finfo(dtype).min)


def _predictions(layout: SharedLayout, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(layout row, column of the predicting position, column of the target), each [S, T], of every response token.

    Response token j of sample s sits at offset[s] + j; it is predicted by the prompt's last token (j = 0) or by the
    response token before it. Positions past a sample's response read a finite dummy inside its row."""
    s, t = batch.response_mask.shape
    lengths = batch.attention_mask.sum(1)                                                      # [S]
    resp_len = (lengths - batch.response_start).clamp(min=1)                                   # [S]
    j = torch.arange(t, device=layout.offset.device)[None, :].expand(s, t)                     # [S, T]
    j = torch.minimum(j, resp_len[:, None] - 1)                                                # stay in the sample
    target = layout.offset[:, None] + j                                                        # [S, T]
    pred = torch.where(j == 0, layout.prompt_last[:, None], target - 1)                        # [S, T]
    target = target.clamp(max=layout.input_ids.shape[1] - 1)                   # an empty response's dummy
    return layout.row[:, None].expand(s, t), pred, target


def _token_logprobs(picked: torch.Tensor, targets: torch.Tensor, batch: TrainBatch, temperature: float
                    ) -> torch.Tensor:
    """picked: [S, T, V] logits predicting targets [S, T] -> logprobs [S, T] (float32), entropy recorded."""
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(picked.float() / scale, dim=-1)                                   # [S, T, V]
    record_entropy(batch, logp)                                                                # extras["entropy"]
    return torch.gather(logp, 2, targets[:, :, None]).squeeze(2)                               # [S, T]


def shared_response_logprobs(logits: torch.Tensor, layout: SharedLayout, batch: TrainBatch, temperature: float,
                             first: int = 0) -> torch.Tensor:
    """logits [R, L - first, V] of the layout's positions first.. -> logprobs [S, T] of each row's response tokens
    (float32)."""
    rows, pred, target = _predictions(layout, batch)                                           # [S, T] each
    picked = logits[rows, (pred - first).clamp(min=0)]                                         # [S, T, V]
    return _token_logprobs(picked, layout.input_ids[rows, target], batch, temperature)


def shared_forward_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float, rows: list[list[int]],
                            pad_id: int, compute_dtype: torch.dtype) -> torch.Tensor:
    """Run the causal LM on the shared layout of `rows`; response-token logprobs [S, T]. A model switched to
    grid attention (grid_attention.py) runs the layout's real tokens only (`_unpadded_logprobs`)."""
    layout = lay_out(batch, rows, pad_id)
    mask = attention_mask_for(model, shared_mask(layout.segment), compute_dtype)
    if uses_grid_attention(model):
        return _unpadded_logprobs(model, batch, temperature, layout, mask)
    read_from = int(layout.prompt_last.min()) if layout.prompt_last.numel() else 0
    first, keep = logits_window(model, layout.input_ids.shape[1], read_from)
    out = model(input_ids=layout.input_ids, position_ids=layout.position_ids, attention_mask=mask, use_cache=False,
                **keep)
    return shared_response_logprobs(out.logits, layout, batch, temperature, first)   # logits [R, L - first, V]


def _unpadded_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float, layout: SharedLayout,
                       mask: torch.Tensor) -> torch.Tensor:
    """The layout's real tokens as one packed row [1, T] through a GRID_SDPA model (attention on the grid with
    `mask` [R, 1, L, L]); the LM head only on the positions that predict a response token. Logprobs [S, T]."""
    grid = Grid.of(layout.segment >= 0)
    ids = layout.input_ids.reshape(-1).index_select(0, grid.cells).unsqueeze(0)                 # [1, T]
    pos = layout.position_ids.reshape(-1).index_select(0, grid.cells).unsqueeze(0)              # [1, T]
    rows, pred, target = _predictions(layout, batch)                                           # [S, T] each
    width = layout.input_ids.shape[1]
    at = grid.source[rows * width + pred]                                                     # [S, T] packed
    keep: dict[str, torch.Tensor] = {}
    if takes_logits_to_keep(model):
        kept, at = torch.unique(at, return_inverse=True)                                       # [K], [S, T]
        keep["logits_to_keep"] = kept
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False, **keep, **{GRID_KEY: grid})
    picked = out.logits[0][at]                                                                 # [S, T, V]
    return _token_logprobs(picked, layout.input_ids[rows, target], batch, temperature)


class SharedPromptForward:
    """A trainer forward that lays batches out shared where that saves tokens and runs `fallback` otherwise.

    The first shared batch is also run through `fallback` for a few rows (no grad) to check the model honours
    custom masks and position ids; on a mismatch the layout is switched off for the run."""

    def __init__(self, fallback: ForwardFn, max_tokens: int, pad_id: int, compute_dtype: torch.dtype) -> None:
        self.fallback, self.max_tokens, self.pad_id, self.compute_dtype = fallback, max_tokens, pad_id, compute_dtype
        self.checked = False
        self.enabled = True
        self.shared_batches = 0        # batches laid out shared (for metrics and tests)

    def __call__(self, model: torch.nn.Module, batch: TrainBatch, temperature: float) -> torch.Tensor:
        rows = plan(batch, self.max_tokens) if self.enabled else None
        if rows is not None and not self.checked:
            self.checked = True
            self.enabled = self._honoured(model, batch, temperature, rows)
            if not self.enabled:
                rows = None
        if rows is None:
            return self.fallback(model, batch, temperature)
        self.shared_batches += 1
        return shared_forward_logprobs(model, batch, temperature, rows, self.pad_id, self.compute_dtype)

    def _honoured(self, model: torch.nn.Module, batch: TrainBatch, temperature: float, rows: list[list[int]]
                  ) -> bool:
        probe = rows[0]
        sub = select_rows(batch, torch.tensor(probe, device=batch.input_ids.device), trim=True)
        sub.extras = {}
        with torch.no_grad():
            want = self.fallback(model, sub, temperature)                                        # [k, T]
            got = shared_forward_logprobs(model, sub, temperature, [list(range(len(probe)))],
                                          self.pad_id, self.compute_dtype)                      # [k, T]
        live = sub.response_mask > 0
        diff = float((want - got).abs()[live].max()) if bool(live.any()) else 0.0
        tol = CHECK_TOLERANCE.get(self.compute_dtype, 5e-2)
        if diff > tol:
            log.warning("shared-prompt forward switched off: on the first batch its logprobs differ from the padded "
                        "forward's by %.3g (> %.3g); the model may ignore custom 4D masks or position ids", diff, tol)
            return False
        log.info("shared-prompt forward checked on the first batch (max logprob difference %.3g)", diff)
        return True
