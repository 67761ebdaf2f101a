"""On-policy distillation against references computed without the code under test: the `distill` advantage fed to
the trainer's clipped loss gives, in expectation over the student's own tokens, exactly the gradient of the reverse
KL(student || teacher) (autograd of the closed form on a small categorical), and the vocabulary check refuses a
teacher whose tokenizer maps ids differently or has another size, naming what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from examples.addition.tokenizer import CHARS, EOS, PAD, UNK, build_tokenizer, save_tokenizer
from rlfleet.config import TisConfig
from rlfleet.services.trainer.advantages import distill
from rlfleet.services.trainer.losses import ClippedPolicyLoss
from rlfleet.weights.model_source import ModelError
from rlfleet.weights.vocabulary import check_same_vocabulary, vocabulary_differences
from tests.support.train_batches import train_batch

V = 7


def test_distill_policy_gradient_is_the_reverse_kl_gradient() -> None:
    torch.manual_seed(0)
    student_logits = torch.randn(V, requires_grad=True)                    # [V]: one position, V tokens
    teacher_logp = torch.log_softmax(torch.randn(V), -1)                     # [V]
    loss_fn = ClippedPolicyLoss(tis=TisConfig(mode="none"))
    # the expectation over the student's token x of the per-sample gradient, weighted exactly by s(x)
    student_p = torch.softmax(student_logits, -1).detach()                  # [V]
    expected_grad = torch.zeros(V)
    for x in range(V):
        logp = torch.log_softmax(student_logits, -1)[x].reshape(1, 1)        # [S=1, T=1]
        batch = train_batch([[1.0]], old=logp.detach(), teacher_logprobs=teacher_logp[x].reshape(1, 1))
        adv = distill(batch)                                                 # [1, 1]
        assert float(adv) == pytest.approx(float(teacher_logp[x] - logp.detach()), abs=1e-7)
        (g,) = torch.autograd.grad(loss_fn(logp, adv, batch, 1.0).loss, student_logits)
        expected_grad += student_p[x] * g
    # reference: autograd of KL(s || t) = sum_x s(x) (log s(x) - log t(x)), the closed form
    logits = student_logits.detach().clone().requires_grad_(True)
    log_s = torch.log_softmax(logits, -1)
    (torch.exp(log_s) * (log_s - teacher_logp)).sum().backward()
    torch.testing.assert_close(expected_grad, logits.grad, rtol=1e-5, atol=1e-6)


def test_distill_advantage_is_zero_off_the_response_mask() -> None:
    batch = train_batch([[1, 1, 0]], old=[[-1.0, -2.0, -3.0]], teacher_logprobs=torch.tensor([[-0.5, -2.5, -9.0]]))
    assert distill(batch).tolist() == [[0.5, -0.5, 0.0]]


def _folder(path: Path, vocab_size: int, swap: tuple[str, str] | None = None, extra: str | None = None) -> Path:
    """A model folder's vocabulary part: the addition tokenizer (two tokens' ids swapped, or one token added) and a
    config.json naming the logits width."""
    path.mkdir()
    tok = save_tokenizer(path) if swap is None and extra is None else build_tokenizer()
    if swap is not None or extra is not None:
        table = json.loads(tok.backend_tokenizer.to_str())
        vocab = table["model"]["vocab"]
        if swap is not None:
            vocab[swap[0]], vocab[swap[1]] = vocab[swap[1]], vocab[swap[0]]
        if extra is not None:
            vocab[extra] = len(vocab)
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(table)), bos_token="<s>",
                                eos_token=EOS, pad_token=PAD, unk_token=UNK).save_pretrained(str(path))
    (path / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    return path


def test_the_vocabulary_check_names_what_differs(tmp_path: Path) -> None:
    n = 4 + len(CHARS)
    student = _folder(tmp_path / "student", n)
    assert vocabulary_differences(student, _folder(tmp_path / "same", n)) == []
    check_same_vocabulary(student, tmp_path / "same")
    swapped = _folder(tmp_path / "swapped", n, swap=("1", "2"))
    diffs = vocabulary_differences(student, swapped)
    assert any("2 token(s) with another id" in d and "'1': id 5 vs 6" in d for d in diffs), diffs
    assert any("'12+34=' encodes to" in d for d in diffs), diffs
    with pytest.raises(ModelError, match=r"does not share the student's vocabulary .*same tokenizer"):
        check_same_vocabulary(student, swapped)
    bigger = _folder(tmp_path / "bigger", n + 1, extra="x")
    diffs = vocabulary_differences(student, bigger)
    assert f"config.json vocab_size {n} vs {n + 1}" in diffs and f"tokenizer length {n} vs {n + 1}" in diffs, diffs
