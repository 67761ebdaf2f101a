"""A raw completion's prompt text is tokenised as the run's own text prompts are (the held-out evaluation, the
rollout context, the warm start: the tokenizer's special tokens, here the addition tokenizer's <s>), so an external
agent's episodes train the model in the context it is evaluated in. Before, the endpoint dropped the <s>: the agent
trained the model on contexts the evaluation never shows it. The session's text stays the client's text, so a second
turn that extends it is still accepted, and only the model's tokens carry loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from examples.addition.tokenizer import save_tokenizer
from rlfleet.protocols import Generation, GroupTicket, Prompt
from rlfleet.services.rollout.tito import TitoSession
from rlfleet.services.trainer.evaluation import encode_prompt


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = tmp_path_factory.mktemp("tok")
    save_tokenizer(path)
    return AutoTokenizer.from_pretrained(str(path))


def test_a_completion_prompt_is_encoded_as_the_runs_prompts_are(tok: Any) -> None:
    session = TitoSession.from_prompt(tok, "12+34=")
    evaluated = encode_prompt(tok, Prompt(index=0, text="12+34="))     # what the held-out evaluation feeds the model
    assert evaluated[0] == tok.bos_token_id                              # this tokenizer adds <s>
    assert session.prompt_ids == evaluated

    # turn 1: the model's "46</s>"; turn 2: the agent's text, as returned, plus its next question
    answer = tok.encode("46", add_special_tokens=False) + [tok.eos_token_id]
    session.add_generation(Generation(output_ids=tuple(answer), logprobs=(-0.5,) * len(answer), finish_reason="stop",
                                      weight_version=3))
    assert session.text == "12+34=46</s>"                                # the client's text: no <s> in front
    question = session.extend_text("12+34=46</s> 1+2=")
    assert question == tok.encode(" 1+2=", add_special_tokens=False)     # no second <s> mid-sequence
    second = tok.encode("3", add_special_tokens=False) + [tok.eos_token_id]
    session.add_generation(Generation(output_ids=tuple(second), logprobs=(-0.1,) * len(second), finish_reason="stop",
                                      weight_version=3))
    sample = session.to_sample(GroupTicket("g", 0, 1), 0)
    assert sample.prompt_ids == evaluated
    assert sample.response_ids == answer + question + second
    assert sample.loss_mask == [1] * len(answer) + [0] * len(question) + [1] * len(second)
