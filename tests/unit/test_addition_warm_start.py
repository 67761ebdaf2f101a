"""The addition example's warm start encodes its supervised rows in batches: the ids must be exactly those of
encoding each prompt and answer alone, so the warm-start weights (and every figure measured from them) are unchanged.
"""

from __future__ import annotations

from examples.addition.data import train_prompts
from examples.addition.tokenizer import build_tokenizer
from examples.addition.warm_start import _encode


def test_batched_encoding_equals_one_text_at_a_time() -> None:
    tok = build_tokenizer()
    data = train_prompts(seed=3)
    rows = [data[i] for i in range(10_000)]          # past the end of the 9,500 training pairs: a second epoch
    got = _encode(tok, rows)
    for p, (ids, start) in zip(rows, got, strict=True):
        prompt = tok.encode(p.text)
        assert ids == prompt + tok.encode(p.label, add_special_tokens=False) + [tok.eos_token_id]
        assert start == len(prompt)
        assert tok.decode(ids[start:-1]) == p.label          # the answer span holds the label's digits
