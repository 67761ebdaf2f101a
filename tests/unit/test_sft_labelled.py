"""Supervised fine-tuning through the trainer's machinery, against references computed without it: the data
replica's labelled samples hold the tokens the example's own in-process encoding gives (examples/addition/
warm_start.py), the trainer's batch + forward + SftLoss equal Hugging Face's label loss (cross-entropy on the label
tokens, -100 elsewhere) in value and gradient, also split over two ranks' shares, and a row without a target is
refused with a message naming the row."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from examples.addition.data import train_prompts
from examples.addition.tokenizer import save_tokenizer
from examples.addition.warm_start import _encode
from rlfleet.data.labels import LabelError, check_labelled, labelled_ids
from rlfleet.protocols import Generation, GroupTicket, Prompt, SamplingParams
from rlfleet.sample import Sample
from rlfleet.services.rollout.labelled import labelled
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs
from rlfleet.services.trainer.losses import SftLoss

# user turns end with "=", assistant turns with eos: "12+34=46</s>"
TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'user' %}={% else %}{{ eos_token }}{% endif %}"
            "{% endfor %}")


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("tok")
    save_tokenizer(path)
    return AutoTokenizer.from_pretrained(str(path))


class _Ctx:
    """A RolloutContext with the parts `labelled` reads (tokenizer, encode_prompt, weight_version); it never
    generates or scores."""

    replica_id = "replica-0"
    sampling = SamplingParams()
    run_seed = 0

    def __init__(self, tok) -> None:
        self.tokenizer = tok
        self.weight_version = 7

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return list(self.tokenizer.encode(prompt.text))

    def generate(self, input_ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
        raise AssertionError("the data replica does not generate")

    def score(self, prompt: Prompt, sample: Sample) -> Sample:
        raise AssertionError("the data replica does not score")


def test_labelled_samples_hold_the_examples_own_encoding(tok) -> None:
    prompts = [train_prompts(seed=0)[i] for i in range(6)]
    expected = _encode(tok, prompts)                                    # (prompt + answer + eos, answer start)
    for prompt, (ids, start) in zip(prompts, expected, strict=True):
        [sample] = list(labelled(_Ctx(tok), prompt, GroupTicket("g", prompt.index, 1)))
        assert sample.prompt_ids + sample.response_ids == ids and len(sample.prompt_ids) == start
        assert sample.weight_version == 7 and sample.rollout_logprobs == [0.0] * len(sample.response_ids)


def test_chat_rows_train_on_the_assistant_turn(tok) -> None:
    tok.chat_template = TEMPLATE
    prompt = Prompt(index=3, messages=({"role": "user", "content": "12+34"}, {"role": "assistant", "content": "46"}))
    prompt_ids, target = labelled_ids(tok, lambda p: [], prompt)
    assert prompt_ids == tok.encode("12+34=", add_special_tokens=False)
    assert target == tok.encode("46", add_special_tokens=False) + [tok.eos_token_id]


def test_a_row_without_a_target_is_refused(tok) -> None:
    with pytest.raises(LabelError, match=r"row 5 has no target .*label_field.*messages_field"):
        check_labelled(Prompt(index=5, text="1+1="), "rollout data")
    with pytest.raises(LabelError, match="row 2"):
        labelled_ids(tok, lambda p: [], Prompt(index=2, messages=({"role": "user", "content": "1+1"},)))


def _model(tok) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(cfg).float()


def test_sft_loss_equals_the_label_cross_entropy(tok) -> None:
    model = _model(tok)
    prompts = [train_prompts(seed=0)[i] for i in range(8)]
    samples: list[Sample] = [s for p in prompts for s in labelled(_Ctx(tok), p, GroupTicket(f"g{p.index}", p.index, 1))]
    batch = build_train_batch(samples, pad_id=tok.pad_token_id)
    tokens = float(batch.response_mask.sum())
    loss = SftLoss()(forward_logprobs(model, batch, 1.0), torch.zeros(1), batch, tokens).loss
    loss.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    # reference: Hugging Face's own label loss over right-padded rows, labels = the response tokens, -100 elsewhere
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    ids = torch.full((len(samples), width), tok.pad_token_id)                 # [S, L]
    labels = torch.full((len(samples), width), -100)                          # [S, L]
    attention = torch.zeros((len(samples), width), dtype=torch.long)          # [S, L]
    for r, s in enumerate(samples):
        row = s.prompt_ids + s.response_ids
        ids[r, :len(row)] = torch.tensor(row)
        attention[r, :len(row)] = 1
        labels[r, len(s.prompt_ids):len(row)] = torch.tensor(s.response_ids)
    ref = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    ref.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    for a, p in zip(ours, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)

    # two ranks' shares (each divides by the global token count) sum to the whole batch's loss
    halves = [build_train_batch(samples[:3], pad_id=tok.pad_token_id),
              build_train_batch(samples[3:], pad_id=tok.pad_token_id)]
    with torch.no_grad():
        shares = [SftLoss()(forward_logprobs(model, b, 1.0), torch.zeros(1), b, tokens).loss for b in halves]
    assert float(sum(shares)) == pytest.approx(float(ref.detach()), rel=1e-5)
