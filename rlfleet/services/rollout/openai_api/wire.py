"""The OpenAI wire format: request bodies -> SamplingParams, a Generation -> response bodies and SSE chunks.

Logprobs are the engine's own, in OpenAI's shapes: chat `choices[0].logprobs.content[i].{token, logprob, bytes}`,
completions `choices[0].logprobs.{tokens, token_logprobs, text_offset}`. `top_logprobs` is accepted but answered with
empty lists: the engine returns only the chosen token's logprob. Every choice also carries rlfleet's extensions
`token_ids` (the engine's output ids) and `weight_version`, and the response `prompt_token_ids` (vLLM's names), so an
agent can see the exact tokens it is trained on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlfleet.protocols import Generation, SamplingParams


class RequestError(ValueError):
    """A request the endpoint refuses (HTTP 400); the message names the field. `code` is OpenAI's error code."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Completion:
    """One finished completion: the engine's generation and the text the client gets for it."""

    generation: Generation
    text: str
    prompt_ids: Sequence[int]


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RequestError(f"'{name}' must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def stop_token_ids(body: Mapping[str, Any], tokenizer: Any) -> tuple[int, ...]:
    """`stop` strings that are one token of the tokenizer, plus `stop_token_ids` (vLLM's field). The engine stops on
    token ids, so a stop string of several tokens is refused rather than cut out of the text (which would part the
    text from the ids the trainer sees)."""
    stop = body.get("stop")
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    ids: list[int] = []
    for s in strings:
        if not isinstance(s, str):
            raise RequestError(f"'stop' entries must be strings, got {s!r}")
        encoded = [int(t) for t in tokenizer.encode(s, add_special_tokens=False)]
        if len(encoded) != 1:
            raise RequestError(f"stop string {s!r} is {len(encoded)} tokens; the engine stops on single tokens "
                               "(give a one-token string or 'stop_token_ids')")
        ids.append(encoded[0])
    extra = body.get("stop_token_ids") or []
    if not isinstance(extra, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in extra):
        raise RequestError("'stop_token_ids' must be a list of token ids")
    return tuple(dict.fromkeys([*ids, *extra]))


def sampling_of(body: Mapping[str, Any], default: SamplingParams, tokenizer: Any, room: int | None) -> SamplingParams:
    """SamplingParams of a request; `room` is how many tokens the model's context has left after the prompt."""
    if body.get("n", 1) != 1:
        raise RequestError("'n' must be 1 (ask again for more completions: each is its own TITO sample)")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is None:
        limit = default.max_new_tokens
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise RequestError(f"'max_tokens' must be a positive integer, got {limit!r}")
    if room is not None:
        if room < 1:
            raise RequestError("the prompt fills the model's whole context: no room for a completion",
                               "context_length_exceeded")
        limit = min(limit, room)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"'seed' must be an integer, got {seed!r}")
    top_k = body.get("top_k", default.top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise RequestError(f"'top_k' must be a non-negative integer, got {top_k!r}")
    return SamplingParams(temperature=_number(body, "temperature", default.temperature, 0.0, 2.0),
                          top_p=_number(body, "top_p", default.top_p, 0.0, 1.0) or 1.0, top_k=top_k,
                          max_new_tokens=limit, stop_token_ids=stop_token_ids(body, tokenizer),
                          seed=None if seed is None else seed % 2**63)


def messages_of(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The chat messages as {role, content} with string content (a list of text parts is joined)."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a 'role'")
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({"role": m["role"], "content": content})
    return out


def prompt_of(body: Mapping[str, Any]) -> str | list[int]:
    """A completion prompt: a string or a list of token ids (one prompt only)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [int(t) for t in prompt]
    raise RequestError("'prompt' must be one non-empty string or one list of token ids")


def finish_reason(gen: Generation) -> str:
    return {"stop": "stop", "length": "length"}.get(gen.finish_reason, "abort")


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    return [str(tokenizer.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False)) for t in ids]


def chat_logprobs(tokenizer: Any, gen: Generation) -> dict[str, Any]:
    return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
                        for tok, lp in zip(token_strings(tokenizer, gen.output_ids), gen.logprobs, strict=True)],
            "refusal": None}


def completion_logprobs(tokenizer: Any, gen: Generation) -> dict[str, Any]:
    tokens = token_strings(tokenizer, gen.output_ids)
    offsets, at = [], 0
    for tok in tokens:
        offsets.append(at)
        at += len(tok)
    return {"tokens": tokens, "token_logprobs": list(gen.logprobs), "top_logprobs": None, "text_offset": offsets}


def usage_of(c: Completion) -> dict[str, int]:
    p, n = len(c.prompt_ids), len(c.generation.output_ids)
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}


def head(kind: str, model: str) -> dict[str, Any]:
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}


def chat_response(c: Completion, model: str, tokenizer: Any, logprobs: bool) -> dict[str, Any]:
    gen = c.generation
    choice = {"index": 0, "message": {"role": "assistant", "content": c.text},
              "logprobs": chat_logprobs(tokenizer, gen) if logprobs else None, "finish_reason": finish_reason(gen),
              "token_ids": list(gen.output_ids), "weight_version": gen.weight_version}
    return {**head("chat.completion", model), "choices": [choice], "usage": usage_of(c),
            "prompt_token_ids": list(c.prompt_ids)}


def completion_response(c: Completion, model: str, tokenizer: Any, logprobs: bool) -> dict[str, Any]:
    gen = c.generation
    choice = {"index": 0, "text": c.text, "logprobs": completion_logprobs(tokenizer, gen) if logprobs else None,
              "finish_reason": finish_reason(gen), "token_ids": list(gen.output_ids),
              "weight_version": gen.weight_version}
    return {**head("text_completion", model), "choices": [choice], "usage": usage_of(c),
            "prompt_token_ids": list(c.prompt_ids)}


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
