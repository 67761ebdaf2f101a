"""Server-Sent Events of one completion in OpenAI's chunk format, token by token as the engine chooses them.

With a streaming engine (`submit_streaming`: the torch engine) each output token is sent the moment it is chosen: its
text delta, its logprob and its id. An engine without it (SGLang, or partial rollouts in retract mode, where a chosen
token may be dropped and regenerated) gives the same chunks once the completion has finished. Either way the chunks'
ids are the generation's output ids, and their text deltas add up to the non-streamed answer's text.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterator
from typing import Any

from rlfleet.services.rollout.openai_api.app import OpenAIApp, Turn
from rlfleet.services.rollout.openai_api.wire import finish_reason, head, usage_of

log = logging.getLogger(__name__)

POLL_S = 0.05          # how often the stream looks at whether the generation ended without a new token


class TextDeltas:
    """The text of a growing id sequence as deltas: the decode of every id so far minus what was already sent (a
    token that ends inside a multi-byte character sends nothing until the character is whole)."""

    def __init__(self, tokenizer: Any, skip_special: bool) -> None:
        self._tok, self._skip, self.shown = tokenizer, skip_special, ""

    def push(self, ids: list[int]) -> str:
        text = str(self._tok.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False))
        if not text.startswith(self.shown) or text.endswith("\ufffd"):
            return ""
        piece, self.shown = text[len(self.shown):], text
        return piece

    def rest(self, final: str) -> str:
        piece = final[len(self.shown):] if final.startswith(self.shown) else ""
        self.shown = final
        return piece


def _token_logprob(tokenizer: Any, token: int, logprob: float, chat: bool) -> dict[str, Any]:
    text = str(tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False))
    if chat:
        return {"content": [{"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}],
                "refusal": None}
    return {"tokens": [text], "token_logprobs": [logprob], "top_logprobs": None, "text_offset": [0]}


def stream_events(app: OpenAIApp, turn: Turn, model: str, logprobs: bool, usage: bool) -> Iterator[dict[str, Any]]:
    """The chunks of `turn` (begun with app.begin). Always finishes the turn (records it, frees the session), also
    when the reader stops early. Raises GenerationTimeout past the turn's deadline."""
    chat, tok = turn.chat, app.tokenizer
    top = head("chat.completion.chunk" if chat else "text_completion", model)
    deltas = TextDeltas(tok, skip_special=chat)
    ids: list[int] = []
    offset = 0

    def token_chunk(token: int, logprob: float) -> dict[str, Any]:
        nonlocal offset
        ids.append(token)
        piece = deltas.push(ids)
        lp = _token_logprob(tok, token, logprob, chat) if logprobs else None
        if lp is not None and not chat:
            lp["text_offset"] = [offset]
        offset += len(piece)
        body: dict[str, Any] = {"delta": {"content": piece}} if chat else {"text": piece}
        return {**top, "choices": [{"index": 0, **body, "logprobs": lp, "finish_reason": None,
                                    "token_ids": [token]}]}

    finished = False
    try:
        if chat:
            yield {**top, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                       "finish_reason": None}]}
        while not turn.future.done() and time.monotonic() < turn.deadline:
            try:
                token, logprob = turn.tokens.get(timeout=POLL_S)
            except queue.Empty:
                continue
            yield token_chunk(token, logprob)
        finished = True
        completion = app.finish(turn)
        gen = completion.generation
        for token, logprob in zip(gen.output_ids[len(ids):], gen.logprobs[len(ids):], strict=True):
            yield token_chunk(token, logprob)                     # not streamed (yet): sent now, in order
        rest = deltas.rest(completion.text)
        if rest:
            tail: dict[str, Any] = {"delta": {"content": rest}} if chat else {"text": rest}
            yield {**top, "choices": [{"index": 0, **tail, "logprobs": None, "finish_reason": None}]}
        end: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
        yield {**top, "choices": [{"index": 0, **end, "logprobs": None, "finish_reason": finish_reason(gen),
                                   "weight_version": gen.weight_version}],
               "prompt_token_ids": list(completion.prompt_ids)}
        if usage:
            yield {**top, "choices": [], "usage": usage_of(completion)}
    finally:
        if not finished:                 # the reader went away: the turn is still recorded when it ends
            try:
                app.finish(turn)
            except Exception as exc:  # noqa: BLE001 - nobody is listening any more
                log.info("stream ended early; its turn ended with %s", type(exc).__name__)
