"""MoE routes (R3) from an SGLang 0.5.23 server, in the torch engine's per-token layout.

The switch is the torch engine's: a MoE model records routes, a dense one does not (moe_routes.RouteRecorder
attaches to every `*TopKRouter`). Here the model folder's config.json says it: `moe_shape` is None for a dense model.

SGLang side (verified against the installed 0.5.23 sources and a live CPU server, tests/unit/test_sglang_routes.py,
tests/integration/test_sglang_moe_routes.py):
  - the server captures routes only when launched with `--enable-return-routed-experts`
    (ServerArgs.enable_return_routed_experts); a request asks with `return_routed_experts: true`;
  - the answer covers KV positions [routed_experts_start_len, P + T - 1) (P prompt, T output tokens; the last output
    token is never forwarded), as meta_info.routed_experts: base64 of the int32 host buffer rows
    [rows, num_hidden_layers, num_experts_per_tok] (detokenizer_manager._b64_encode_per_request, decoded by
    sglang.srt.state_capturer.routed_experts.extract_routed_experts_from_meta_info); a dense layer's row is 0s.
The torch engine keeps, per output token t, the routes of the forward that produced it: position P - 1 + t. So the
request starts at P - 1 (T rows), and only the MoE layers are kept, in layer order, as int64 [T, moe_layers, K].
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.services.rollout.engines.base import EngineError

SERVER_FLAG = "--enable-return-routed-experts"


@dataclass(frozen=True)
class MoeShape:
    num_layers: int                   # num_hidden_layers: the rows SGLang returns per position
    moe_layers: tuple[int, ...]       # which of them route (the torch engine's routers, in order)
    top_k: int                        # num_experts_per_tok


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def _is_moe_layer(cfg: dict[str, Any], layer: int) -> bool:
    """The transformers rules: Qwen2/3-MoE (mlp_only_layers, decoder_sparse_step), DeepSeek-style
    (first_k_dense_replace, moe_layer_freq); otherwise every layer routes (Mixtral, OLMoE, GPT-OSS)."""
    if layer in (cfg.get("mlp_only_layers") or []):
        return False
    step = int(cfg.get("decoder_sparse_step") or 1)
    if (layer + 1) % step:
        return False
    if layer < int(cfg.get("first_k_dense_replace") or 0):
        return False
    return layer % int(cfg.get("moe_layer_freq") or 1) == 0


def moe_shape(model_path: str | Path) -> MoeShape | None:
    """The route shape of the model folder's config.json; None for a dense model (no routes are recorded)."""
    try:
        cfg = _text_config(json.loads((Path(model_path) / "config.json").read_text()))
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read {model_path}/config.json: {exc}") from exc
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    top_k = int(cfg.get("num_experts_per_tok") or 0)
    if not experts or not top_k:
        return None
    layers = int(cfg["num_hidden_layers"])
    return MoeShape(num_layers=layers, moe_layers=tuple(i for i in range(layers) if _is_moe_layer(cfg, i)),
                    top_k=top_k)


def routes_request(prompt_len: int) -> dict[str, Any]:
    """/generate fields asking for the routes of the positions that produce the output tokens."""
    return {"return_routed_experts": True, "routed_experts_start_len": prompt_len - 1}


def decode_routes(encoded: str, n_tokens: int, shape: MoeShape) -> np.ndarray:
    """meta_info.routed_experts of a request sent with routes_request -> [T, moe_layers, K] int64 expert ids."""
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise EngineError(f"SGLang routed_experts is not base64: {exc}") from exc
    per_row = shape.num_layers * shape.top_k
    flat = np.frombuffer(raw, dtype="<i4")
    if len(raw) % 4 or flat.size != n_tokens * per_row:
        raise EngineError(f"SGLang returned {len(raw)} bytes of routes; {n_tokens} output tokens x "
                          f"{shape.num_layers} layers x top-{shape.top_k} int32 is {n_tokens * per_row * 4}")
    rows = flat.reshape(n_tokens, shape.num_layers, shape.top_k)[:, list(shape.moe_layers)]
    return rows.astype(np.int64)
