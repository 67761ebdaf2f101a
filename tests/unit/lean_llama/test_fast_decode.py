"""The lean decode step's cache buffers (lean_llama/fast_decode.py): rows leave in one copy, and a long generation
with a few spare columns re-buffers into two reused storages per layer while every step matches the full forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.tiny_model import make_tiny_model

torch.set_num_threads(1)
PROMPTS = [[1, 4, 5, 6], [1, 7], [1, 8, 9, 10, 11, 12], [1, 5], [1, 6, 6, 13], [1, 9, 9, 9, 14, 15, 16],
           [1, *range(4, 19), *range(18, 8, -1)]]        # tests/unit/test_torch_engine.py's prompts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()


def test_finished_rows_leave_the_decode_buffers_in_one_copy(model_dir: Path) -> None:
    """FastDecoder.select keeps exactly the rows and columns kv_cache.select keeps, compacting each layer's buffer
    (spare columns included) so the next decode step appends in place; with many spare columns it slices instead."""
    import copy

    from rlfleet.services.rollout.engines import kv_cache
    from rlfleet.services.rollout.engines.lean_llama.fast_decode import FastDecoder

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.inference_mode():
        for room, one_copy in ((4, True), (64, False)):
            dec = FastDecoder(model, slack=room)
            prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[5]]
            prefilled = dec.prefill(prompts, torch.tensor([0, 1, 2, 2]), room)   # 4 rows, 3 prompts
            cache, mask, logits = prefilled.cache, prefilled.mask, prefilled.logits
            last, pos = logits.argmax(-1), mask.sum(1)
            for _ in range(2):                                                          # two decode steps
                mask = torch.cat([mask, mask.new_ones(4, 1)], dim=1)
                last, pos = dec.decode(cache, last, pos, mask, room).logits.argmax(-1), pos + 1
            rows = torch.tensor([1, 3])                 # rows 0 and 2 finish; both kept rows have no left padding
            expected = copy.deepcopy(cache)
            want_mask = kv_cache.select(expected, mask, rows)
            got_mask = dec.select(cache, mask, rows)
            assert torch.equal(got_mask, want_mask)
            for got, want in zip(cache.layers, expected.layers, strict=True):
                assert torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)
            before = [kb.data_ptr() for kb, _ in dec._buffers.values()]
            mask = torch.cat([got_mask, got_mask.new_ones(2, 1)], dim=1)
            dec.decode(cache, last[rows], pos[rows], mask, room)
            in_place = [kb.data_ptr() for kb, _ in dec._buffers.values()] == before
            assert in_place == one_copy, room


def test_decode_with_a_few_spare_columns_matches_the_full_forward_through_many_re_bufferings(
        model_dir: Path, hf: torch.nn.Module) -> None:
    """On a CPU the decode buffers get only a few spare columns (fast_decode.cpu_slack), so a long generation
    re-buffers every few steps, alternating between two reused storages per layer, while rows leave on the way.
    Every step's logits equal a full forward over the whole sequence, and no layer ever holds more than two
    storages."""
    from rlfleet.services.rollout.engines.lean_llama.fast_decode import FastDecoder, cpu_slack

    assert cpu_slack(head_dim=32, itemsize=4) == 4 and cpu_slack(64, 4) == 2 and cpu_slack(128, 4) == 1
    assert cpu_slack(64, 2) == 4 and cpu_slack(256, 4) == 1
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[6]]
    with torch.inference_mode():
        dec = FastDecoder(model, slack=3)
        prefilled = dec.prefill(prompts, torch.tensor([0, 1, 2]), 40)
        cache, mask, logits = prefilled.cache, prefilled.mask, prefilled.logits
        assert all(kb.shape[2] == mask.shape[1] + 3 for kb, _ in dec._buffers.values())     # room capped at 3
        seqs = [list(p) for p in prompts]
        last, pos, alive = logits.argmax(-1), mask.sum(1), [0, 1, 2]
        storages: list[set[int]] = [set() for _ in dec._buffers]          # per layer: the pool storages seen
        rebuffers, held = [0] * len(dec._buffers), [kb.data_ptr() for kb, _ in dec._buffers.values()]
        for step in range(30):
            for r, tok in zip(alive, last.tolist(), strict=True):
                seqs[r].append(tok)
            if step == 12:                                      # the middle row finishes: it leaves the buffers
                keep = torch.tensor([0, 2])
                mask = dec.select(cache, mask, keep)
                alive, last, pos = [0, 2], last[keep], pos[keep]
            mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
            logits = dec.decode(cache, last, pos, mask, 40).logits                          # [B, V]
            for i, (kb, _) in dec._buffers.items():
                rebuffers[i] += kb.data_ptr() != held[i]
                held[i] = kb.data_ptr()
                storages[i].update(k.data_ptr() for k, _ in dec._pool.get(i, []))
            for row, r in enumerate(alive):
                want = hf(torch.tensor([seqs[r]])).logits[0, -1]                            # [V]
                assert torch.allclose(logits[row], want, atol=1e-5, rtol=0), (step, r)
            last, pos = logits.argmax(-1), pos + 1
    assert min(rebuffers) >= 8 and [len(s) for s in storages] == [2] * len(storages), (rebuffers, storages)
