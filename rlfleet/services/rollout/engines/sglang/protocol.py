"""SGLang's native HTTP JSON for /generate as plain functions: rlfleet request -> body, answer -> Generation.

The body follows sglang.api.v1.GenerateRequest / SamplingParams of SGLang 0.5.23 (unknown sampling keys are rejected
there); the response follows sglang.api.v1.GenerateResponse (tests/unit/test_sglang_contract.py checks both against
the installed package). Token ids in and out are exact (TITO): output_ids are what the engine sampled, never
re-tokenised text. MoE routes (R3) are asked for and decoded as rlfleet/services/rollout/engines/sglang/routes.py
describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlfleet.protocols import Generation, SamplingParams
from rlfleet.services.rollout.engines.base import EngineError
from rlfleet.services.rollout.engines.sglang.routes import SERVER_FLAG, MoeShape, decode_routes, routes_request


def sampling_body(sampling: SamplingParams) -> dict[str, Any]:
    """rlfleet SamplingParams -> sglang.api.v1.SamplingParams. top_k 0 (off) -> -1 (SGLang's "all tokens")."""
    body: dict[str, Any] = {
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "max_new_tokens": int(sampling.max_new_tokens),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if sampling.stop_token_ids:
        body["stop_token_ids"] = [int(t) for t in sampling.stop_token_ids]
    if sampling.seed is not None:
        body["sampling_seed"] = int(sampling.seed)
    return body


def generate_body(input_ids: Sequence[int], sampling: SamplingParams, rid: str, routes: bool = False
                  ) -> dict[str, Any]:
    """One /generate request: token ids in, per-token logprobs of the output out, no text round trip.
    routes: also the MoE routes of the forwards that produce the output tokens (R3)."""
    body = {
        "rid": rid,
        "input_ids": [int(t) for t in input_ids],
        "sampling_params": sampling_body(sampling),
        "return_logprob": True,
        "logprob_start_len": -1,           # output logprobs only, no prompt logprobs
        "return_text_in_logprobs": False,
        "stream": False,
    }
    return {**body, **routes_request(len(input_ids))} if routes else body


def _version(text: Any, fallback: int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return fallback                     # "default" before the first update: the version the engine started with


def _finish_reason(meta: dict[str, Any]) -> str:
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind in ("stop", "length", "abort"):
        return str(kind)
    raise EngineError(f"SGLang finish_reason {reason!r} is not stop, length or abort")


def token_versions(meta: dict[str, Any], n_tokens: int, fallback: int) -> tuple[int, ...]:
    """Per-output-token weight version from meta_info.weight_versions spans ([start, end) over output tokens);
    without spans, every token carries meta_info.weight_version."""
    whole = _version(meta.get("weight_version"), fallback)
    versions = [whole] * n_tokens
    for span in meta.get("weight_versions") or []:
        v = _version(span.get("version"), fallback)
        for i in range(max(0, int(span.get("start", 0))), min(n_tokens, int(span.get("end", 0)))):
            versions[i] = v
    return tuple(versions)


def _routes(meta: dict[str, Any], n_tokens: int, shape: MoeShape, finish_reason: str) -> np.ndarray | None:
    """[T, moe_layers, K] from meta_info.routed_experts; None for no tokens, or an aborted request without them."""
    if n_tokens == 0:
        return None
    encoded = meta.get("routed_experts")
    try:
        if not isinstance(encoded, str):
            raise EngineError(f"SGLang answered without routed_experts for a MoE model: start the server with "
                              f"{SERVER_FLAG}")
        return decode_routes(encoded, n_tokens, shape)
    except EngineError:
        if finish_reason == "abort":
            return None
        raise


def parse_generate_response(body: dict[str, Any], fallback_version: int, routes: MoeShape | None = None
                            ) -> Generation:
    """A non-streamed /generate answer for one request -> Generation (ids from output_ids, logprobs from
    meta_info.output_token_logprobs entries [logprob, token_id, text]; routes: the MoE shape when asked for)."""
    if not isinstance(body, dict) or "meta_info" not in body:
        raise EngineError(f"SGLang /generate answered without meta_info: {str(body)[:200]}")
    meta = body["meta_info"]
    ids = [int(t) for t in body.get("output_ids") or []]
    entries = meta.get("output_token_logprobs") or []
    if len(entries) != len(ids):
        raise EngineError(f"SGLang returned {len(ids)} output ids but {len(entries)} logprobs")
    for i, (tok, entry) in enumerate(zip(ids, entries, strict=True)):
        if int(entry[1]) != tok:
            raise EngineError(f"SGLang logprob entry {i} is for token {entry[1]}, output id is {tok}")
    logprobs = tuple(float(e[0]) if e[0] is not None else float("nan") for e in entries)
    versions = token_versions(meta, len(ids), fallback_version)
    reason = _finish_reason(meta)
    return Generation(output_ids=tuple(ids), logprobs=logprobs, finish_reason=reason,
                      weight_version=versions[0] if versions else _version(meta.get("weight_version"),
                                                                           fallback_version),
                      token_versions=versions,
                      routed_experts=None if routes is None else _routes(meta, len(ids), routes, reason))
