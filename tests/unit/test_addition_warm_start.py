"""The addition example's warm start: batched encoding gives the ids of encoding each text alone; the probe's
teacher-forced exact match is the share greedy decoding answers exactly; training stops at the target."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from examples.addition.data import train_prompts
from examples.addition.model import build_random_model
from examples.addition.tokenizer import build_tokenizer
from examples.addition.warm_start import _batch, _encode, exact_match, supervised


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


def _greedy_exact(model, tok, rows: list[tuple[list[int], int]]) -> float:
    """The reference: generate greedily from each prompt alone and compare with answer + eos."""
    right = 0
    for ids, start in rows:
        out = model.generate(torch.tensor([ids[:start]]), max_new_tokens=len(ids) - start, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        right += out[0, start:].tolist() == ids[start:]
    return right / len(rows)


def test_exact_match_is_greedy_decoding_exact_match(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_random_model(tmp_path / "m", seed=0)
    tok = build_tokenizer()
    data = train_prompts(seed=0)
    rows = _encode(tok, [data[i] for i in range(48)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    share = []
    for step in range(160):                          # memorise half of the rows: some right, some wrong
        input_ids, labels = _batch(tok, rows[:24])
        loss = model(input_ids=input_ids, attention_mask=(input_ids != tok.pad_token_id).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 40 == 39:
            model.eval()
            with torch.no_grad():
                share.append((exact_match(model, tok, rows), _greedy_exact(model, tok, rows)))
            model.train()
    assert all(a == b for a, b in share), share
    assert 0 < share[-1][0] < 1, share               # a mix of right and wrong rows, so the comparison means something


def test_training_stops_at_the_target(tmp_path: Path) -> None:
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_random_model(tmp_path / "a", seed=0)
    assert supervised(model, tok, 30, seed=0, target=0.0, check_every=10) == 10     # reached at the first check
    model = build_random_model(tmp_path / "b", seed=0)
    assert supervised(model, tok, 30, seed=0, target=1.01, check_every=10) == 30    # never reached: all the steps
    model = build_random_model(tmp_path / "c", seed=0)
    assert supervised(model, tok, 25, seed=0) == 25                                 # no target: the fixed recipe


def test_prepare_keeps_a_warm_start_built_in_process(tmp_path: Path) -> None:
    """A folder prepare_in_process built (the e2e tests' warm start, passed as model.path with the example config)
    is the same warm start as prepare's rlfleet SFT: prepare keeps it rather than rebuilding it over the fixture."""
    from examples.addition.warm_start import RECIPE, prepare

    folder = tmp_path / "warm_start"
    folder.mkdir()
    marker = json.dumps({"recipe": {**RECIPE, "seed": 3}, "steps": 400})
    (folder / "warm_start.json").write_text(marker)
    prepare(str(folder), seed=3)
    assert sorted(p.name for p in folder.iterdir()) == ["warm_start.json"]
    assert (folder / "warm_start.json").read_text() == marker
