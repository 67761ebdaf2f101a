"""TITO (token in, token out) sessions for multi-turn chat rollouts.

An agent speaks chat messages, but the trainer must see exactly the token ids the engine produced: re-tokenising the
rendered conversation can give other ids (a model may emit a non-canonical split such as "1","2" for "12", or merge
across a turn boundary differently). A session therefore keeps one growing token sequence:

- the first turn is the chat template's rendering of the opening messages with add_generation_prompt;
- each engine turn appends the engine's exact output ids (loss mask 1, their logprobs and weight versions);
- each environment turn (tool results, user messages) appends only the *new suffix*: the template's rendering of the
  whole conversation (add_generation_prompt) minus the text already held, tokenised on its own (loss mask 0).

The suffix is computed on text, so it includes whatever the template puts between the model's last token and the
next message (e.g. "<|im_end|>\\n" when the model stopped on a stop string, or only "\\n" when it emitted <|im_end|>).
A template that rewrites earlier turns (trims content, drops reasoning) breaks the prefix property: TitoError.

The client sees each assistant turn with special tokens removed (`messages`, what it must send back), but the template
renders the turn as the model wrote it (`rendered`): its text with special tokens kept, less the one that stopped it.
A model that writes a special token inside a turn (a role marker such as <|user|> mid-answer) thus still extends the
held text, where the cleaned content would not.

MoE routes (R3): the Sample's routes are per response token, the routes of the forward that produced it (see
rlfleet/services/trainer/routing_replay.py). Each engine turn's output tokens keep the routes the engine recorded in
that
turn; environment tokens were never produced by the engine (their positions are the next turn's prompt, which the
engine does not record), so their rows are FREE_ROUTE and the trainer's routers choose there, as for the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlfleet.protocols import Generation, GroupTicket
from rlfleet.sample import FREE_ROUTE, RoutedExperts, Sample, Status
from rlfleet.services.rollout.messages import status_of


class TitoError(ValueError):
    """The chat template's rendering of the conversation does not extend the tokens held so far."""


def _ids(value: Any) -> list[int]:
    if isinstance(value, Mapping) or hasattr(value, "keys"):       # BatchEncoding in newer transformers
        value = value["input_ids"]
    return [int(t) for t in value]


def render_text(tokenizer: Any, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
    return str(tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                             add_generation_prompt=add_generation_prompt))


class TitoSession:
    """One multi-turn conversation as the exact token sequence the engine saw and produced.

    prompt_ids: [P] the first turn's template rendering. response_ids, loss_mask, logprobs, token_versions: [T] each,
    everything after the prompt (model tokens mask 1; tool / environment / user tokens mask 0, logprob 0).
    routes: [T] entries of [layers, K] expert ids (MoE engines) or None (no route recorded: FREE in the Sample).
    """

    def __init__(self, tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> None:
        if not messages:
            raise ValueError("a TITO session needs at least one opening message")
        text = render_text(tokenizer, messages, add_generation_prompt=True)
        ids = _ids(tokenizer.encode(text, add_special_tokens=False))
        self._start(tokenizer, [dict(m) for m in messages], text, ids)

    @classmethod
    def from_prompt(cls, tokenizer: Any, prompt: str | Sequence[int]) -> TitoSession:
        """A session of raw completions (no chat template): the prompt's ids as given, or its text tokenised as the
        run's own text prompts are (the rollout context, the evaluation: with the tokenizer's special tokens, e.g. a
        leading <s>; vLLM's and SGLang's completions do the same). The session's text stays the client's text (no
        <s>): what the client's next prompt extends. Later environment text is tokenised without special tokens."""
        session = cls.__new__(cls)
        if isinstance(prompt, str):
            ids = _ids(tokenizer.encode(prompt))
            session._start(tokenizer, [], prompt, ids)
        else:
            ids = [int(t) for t in prompt]
            session._start(tokenizer, [], _decode_raw(tokenizer, ids), ids)
        if not session.prompt_ids:
            raise ValueError("a TITO session needs a non-empty prompt")
        return session

    def _start(self, tokenizer: Any, messages: list[dict[str, str]], text: str, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.messages: list[dict[str, str]] = messages          # as the client sees them
        self._rendered: list[dict[str, str]] = [dict(m) for m in messages]   # as the template renders them
        self._text = text
        self.prompt_ids: list[int] = prompt_ids
        self.response_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.token_versions: list[int] = []
        self.routes: list[np.ndarray | None] = []
        self.finish_reason = "stop"
        self.weight_version: int | None = None      # version of the first model token
        self.model_turns = 0

    @property
    def input_ids(self) -> list[int]:
        """What the engine continues from next: [P + T]."""
        return self.prompt_ids + self.response_ids

    def add_generation(self, gen: Generation) -> str:
        """Append the engine's exact output ids (mask 1). Returns the assistant's text (special tokens removed)."""
        ids = [int(t) for t in gen.output_ids]
        versions = list(gen.token_versions) or [gen.weight_version] * len(ids)
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += [float(x) for x in gen.logprobs]
        self.token_versions += versions
        self.routes += _turn_routes(gen, len(ids))
        self.finish_reason = gen.finish_reason
        if self.weight_version is None and ids:
            self.weight_version = versions[0]
        self.model_turns += 1
        self._text += _decode_raw(self.tokenizer, ids)
        content = self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        self.messages.append({"role": "assistant", "content": content})
        written = ids[:-1] if gen.finish_reason == "stop" and ids and self._is_special(ids[-1]) else ids
        self._rendered.append({"role": "assistant", "content": _decode_raw(self.tokenizer, written)})
        return content

    def _is_special(self, token: int) -> bool:
        """A token the client's content leaves out (decoding with skip_special_tokens drops it)."""
        shown = self.tokenizer.decode([token], skip_special_tokens=True)
        return bool(_decode_raw(self.tokenizer, [token])) and not shown

    def add_messages(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Append environment messages (tool results, user turns) as the template renders them; mask 0.

        Returns the suffix ids appended (they end with the next assistant header when add_generation_prompt).
        """
        new = [dict(m) for m in messages]
        full = render_text(self.tokenizer, self._rendered + new, add_generation_prompt)
        if not full.startswith(self._text):
            at = next((i for i, (a, b) in enumerate(zip(full, self._text, strict=False)) if a != b),
                      min(len(full), len(self._text)))
            raise TitoError(f"the chat template's rendering does not extend the held conversation at character {at}: "
                            f"held {self._text[at:at + 40]!r}, template {full[at:at + 40]!r}")
        suffix = _ids(self.tokenizer.encode(full[len(self._text):], add_special_tokens=False))
        self._append_environment(suffix)
        self.messages += new
        self._rendered += [dict(m) for m in new]
        self._text = full
        return suffix

    @property
    def text(self) -> str:
        """The whole sequence as text, special tokens kept: what a raw completion continues from."""
        return self._text

    def extend_text(self, full: str) -> list[int]:
        """Raw completions: `full` is the held text plus new environment text; its suffix is appended (mask 0)."""
        if not full.startswith(self._text):
            at = next((i for i, (a, b) in enumerate(zip(full, self._text, strict=False)) if a != b),
                      min(len(full), len(self._text)))
            raise TitoError(f"the prompt does not extend the session's text at character {at}: held "
                            f"{self._text[at:at + 40]!r}, prompt {full[at:at + 40]!r}")
        suffix = _ids(self.tokenizer.encode(full[len(self._text):], add_special_tokens=False)) \
            if len(full) > len(self._text) else []
        self._append_environment(suffix)
        self._text = full
        return suffix

    def extend_ids(self, ids: Sequence[int]) -> list[int]:
        """Raw completions by token ids: `ids` is the held sequence plus new environment ids (mask 0)."""
        ids = [int(t) for t in ids]
        held = self.input_ids
        if ids[:len(held)] != held:
            at = next((i for i, (a, b) in enumerate(zip(ids, held, strict=False)) if a != b), min(len(ids), len(held)))
            raise TitoError(f"the prompt's token ids do not extend the session's at position {at}")
        suffix = ids[len(held):]
        self._append_environment(suffix)
        self._text += _decode_raw(self.tokenizer, suffix)
        return suffix

    def _append_environment(self, suffix: list[int]) -> None:
        last_version = self.token_versions[-1] if self.token_versions else 0
        self.response_ids += suffix
        self.loss_mask += [0] * len(suffix)
        self.logprobs += [0.0] * len(suffix)
        self.token_versions += [last_version] * len(suffix)
        self.routes += [None] * len(suffix)

    def routed_experts(self) -> RoutedExperts | None:
        """The routes of every response position ([T, layers, K], FREE_ROUTE rows where none was recorded); None when
        no engine turn carried routes (a dense model)."""
        known = [r for r in self.routes if r is not None]
        if not known:
            return None
        shapes = {r.shape for r in known}
        if len(shapes) > 1:
            raise ValueError(f"engine turns returned routes of different [layers, K] shapes: {sorted(shapes)}")
        free = np.full(known[0].shape, FREE_ROUTE, dtype=np.int64)
        return RoutedExperts(ids=np.stack([free if r is None else r.astype(np.int64) for r in self.routes]))

    def to_sample(self, ticket: GroupTicket, index: int, replica_id: str = "") -> Sample:
        """The conversation as one Sample: prompt ids, the concatenated response and its loss mask."""
        versions = self.token_versions
        return Sample(group_id=ticket.group_id, index=index, group_size=ticket.group_size,
                      prompt_ids=list(self.prompt_ids), response_ids=list(self.response_ids),
                      rollout_logprobs=list(self.logprobs), loss_mask=list(self.loss_mask),
                      status=status_of(self.finish_reason) if self.model_turns else Status.FAILED,
                      weight_version=self.weight_version or 0,
                      token_versions=list(versions) if len(set(versions)) > 1 else None,
                      routed_experts=self.routed_experts(),
                      prompt_index=ticket.prompt_index, replica_id=replica_id,
                      metadata={"turns": str(self.model_turns)})


def _decode_raw(tokenizer: Any, ids: Sequence[int]) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))


def _turn_routes(gen: Generation, n_tokens: int) -> list[np.ndarray | None]:
    """One engine turn's routes per output token: [layers, K] each, or None per token when the engine recorded none."""
    if gen.routed_experts is None:
        return [None] * n_tokens
    routes = np.asarray(gen.routed_experts)
    if len(routes) != n_tokens:
        raise ValueError(f"the engine returned {len(routes)} routes for {n_tokens} output tokens")
    return list(routes)
