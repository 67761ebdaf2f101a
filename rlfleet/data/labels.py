"""Labelled rows for supervised fine-tuning: the prompt tokens and the target (response) tokens of one data row.

A row's target is, in this order:
- its label (rollout.data.label_field, or a data_source plugin's Prompt.label): the text after the prompt; the
  target is its tokens (no special tokens added) and the tokenizer's eos, so the model learns to stop;
- else, chat messages whose last turn is the assistant's (rollout.data.messages_field): the prompt is the turns
  before it with the generation prompt, the target what the chat template adds for the assistant turn (its content
  and the template's end-of-turn tokens), or the content and eos when the template does not extend the prompt.
A row with neither is refused (LabelError names the row): `rlfleet run` checks the first rows before anything
starts (rlfleet/local/preflight.py), the data replica every row it reads.

Used by the data replica's rollout function (rlfleet/services/rollout/labelled.py) and by the start-up check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlfleet.protocols import Prompt

ASSISTANT = "assistant"


class LabelError(ValueError):
    """A row that cannot be a supervised example; the message names the row and what it lacks."""


def has_target(prompt: Prompt) -> bool:
    """Whether the row holds a target: a label, or messages ending in an assistant turn."""
    return prompt.label is not None or bool(prompt.messages and prompt.messages[-1].get("role") == ASSISTANT)


def check_labelled(prompt: Prompt, where: str) -> None:
    if not has_target(prompt):
        raise LabelError(f"{where}: row {prompt.index} has no target for supervised fine-tuning: give a label column "
                         "(rollout.data.label_field) or chat messages whose last turn is the assistant's "
                         "(rollout.data.messages_field)")


def _ids(encoded: Any) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):       # BatchEncoding in newer transformers
        encoded = encoded["input_ids"]
    return [int(t) for t in encoded]


def labelled_ids(tokenizer: Any, encode_prompt: Callable[[Prompt], list[int]], prompt: Prompt
                 ) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids) of a labelled row; raises LabelError for a row without a target.

    encode_prompt: how the rollout service encodes a prompt (its chat template, system prompt, token ids)."""
    check_labelled(prompt, "rollout data")
    eos = tokenizer.eos_token_id
    tail = [int(eos)] if eos is not None else []
    if prompt.label is not None:
        return encode_prompt(prompt), _ids(tokenizer.encode(prompt.label, add_special_tokens=False)) + tail
    messages: Sequence[Any] = [dict(m) for m in prompt.messages or ()]
    context = [m for m in messages[:-1]]
    prompt_ids = _ids(tokenizer.apply_chat_template(context, tokenize=True, add_generation_prompt=True)) \
        if context else []
    full = _ids(tokenizer.apply_chat_template(messages, tokenize=True))
    if len(full) > len(prompt_ids) and full[:len(prompt_ids)] == prompt_ids:
        return prompt_ids, full[len(prompt_ids):]
    content = str(messages[-1]["content"])
    return prompt_ids, _ids(tokenizer.encode(content, add_special_tokens=False)) + tail
