"""The built-in torch engine: exact greedy outputs, exact logprobs, per-request futures, weight updates."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.protocols import SamplingParams
from rlfleet.services.rollout.engines.base import EngineError
from rlfleet.services.rollout.engines.hf_decoder import HFDecoder
from rlfleet.services.rollout.engines.lean_llama import FastDecoder
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.weight_sync.transports.manifest import digest_of
from tests.support.engine_pairs import assert_engines_agree
from tests.support.tiny_model import make_tiny_model

torch.set_num_threads(1)
PROMPTS = [[1, 4, 5, 6], [1, 7], [1, 8, 9, 10, 11, 12], [1, 5], [1, 6, 6, 13], [1, 9, 9, 9, 14, 15, 16],
           [1, *range(4, 19), *range(18, 8, -1)]]        # 26 tokens: joins a batch whose cache is shorter


def staggered(sampling: SamplingParams, i: int) -> SamplingParams:
    """Different lengths per request, so requests finish at different steps and new ones join a running batch."""
    return dataclasses.replace(sampling, max_new_tokens=sampling.max_new_tokens + 3 * i)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()


@pytest.fixture
def engine(model_dir: Path):
    eng = TorchEngine(model_dir, max_batch_size=4)      # fewer slots than prompts: admission mid-flight
    yield eng
    eng.shutdown()


def teacher_forced(hf: torch.nn.Module, prompt: list[int], output: tuple[int, ...], temperature: float) -> torch.Tensor:
    """logprobs [T] of output under a full forward of prompt+output at temperature (1 for greedy)."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + list(output)])).logits[0, len(prompt) - 1:-1].float()   # [T, V]
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, dim=-1).gather(1, torch.tensor(output).unsqueeze(1)).squeeze(1)


def test_greedy_equals_hf_generate(engine: TorchEngine, hf: torch.nn.Module) -> None:
    futures = [engine.submit(p, staggered(SamplingParams(temperature=0, max_new_tokens=4), i))
               for i, p in enumerate(PROMPTS)]
    for i, (prompt, future) in enumerate(zip(PROMPTS, futures, strict=True)):
        gen = future.result(timeout=60)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=4 + 3 * i, do_sample=False)[0, len(prompt):]
        assert list(gen.output_ids) == ref.tolist()
        assert gen.finish_reason in ("stop", "length") and gen.weight_version == 0


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0, max_new_tokens=5),
    SamplingParams(temperature=0.7, max_new_tokens=5, seed=3),
    SamplingParams(temperature=1.3, top_p=0.8, top_k=6, max_new_tokens=5, seed=4),
])
def test_logprobs_equal_teacher_forced_forward(engine: TorchEngine, hf: torch.nn.Module,
                                               sampling: SamplingParams) -> None:
    futures = [engine.submit(p, staggered(sampling, i)) for i, p in enumerate(PROMPTS)]
    for prompt, future in zip(PROMPTS, futures, strict=True):
        gen = future.result(timeout=60)
        assert len(gen.logprobs) == len(gen.output_ids) > 0
        expected = teacher_forced(hf, prompt, gen.output_ids, sampling.temperature)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-5, rtol=0)


def test_seeded_sampling_does_not_depend_on_the_batch(engine: TorchEngine) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=11)
    alone = engine.submit(PROMPTS[0], sampling).result(timeout=60)
    batch = [engine.submit(p, SamplingParams(temperature=1.0, max_new_tokens=10, seed=i)) for i, p in
             enumerate(PROMPTS)]
    again = engine.submit(PROMPTS[0], sampling)
    assert again.result(timeout=60).output_ids == alone.output_ids
    assert all(f.result(timeout=60) for f in batch)


def test_each_future_resolves_when_its_request_finishes(engine: TorchEngine) -> None:
    long = engine.submit(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=40))
    seen: dict[str, bool] = {}
    short = engine.submit(PROMPTS[1], SamplingParams(temperature=0, max_new_tokens=2))
    short.add_done_callback(lambda f: seen.setdefault("long_done", long.done()))
    assert len(short.result(timeout=60).output_ids) == 2
    assert seen == {"long_done": False}          # resolved while the long request was still generating
    gen = long.result(timeout=60)
    assert gen.finish_reason == "length" and len(gen.output_ids) == 40


def test_stop_token_ends_the_request(engine: TorchEngine) -> None:
    free = engine.submit(PROMPTS[2], SamplingParams(temperature=0, max_new_tokens=12)).result(timeout=60)
    stop = free.output_ids[3]
    gen = engine.submit(PROMPTS[2], SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=(stop,)))
    out = gen.result(timeout=60)
    assert out.finish_reason == "stop" and out.output_ids[-1] == stop
    assert out.output_ids == free.output_ids[:free.output_ids.index(stop) + 1]


def test_pause_holds_generation_until_resume(engine: TorchEngine) -> None:
    engine.pause()
    future = engine.submit(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=3))
    time.sleep(0.2)
    assert not future.done()
    engine.resume()
    assert len(future.result(timeout=60).output_ids) == 3


def test_weight_update_changes_outputs_and_digest_matches_trainer(engine: TorchEngine, tmp_path: Path) -> None:
    other_dir = make_tiny_model(tmp_path / "other", seed=1)
    other = AutoModelForCausalLM.from_pretrained(str(other_dir)).eval()
    trainer_tensors = [(n, t.detach().clone()) for n, t in other.state_dict().items()]   # what a trainer publishes
    before = engine.submit(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=12)).result(timeout=60)
    engine.update_weights_from_tensor(trainer_tensors, version=1)
    assert engine.weight_version == 1
    after = engine.submit(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=12)).result(timeout=60)
    with torch.no_grad():
        ref = other.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=12, do_sample=False)[0, len(PROMPTS[0]):]
    assert list(after.output_ids) == ref.tolist()
    assert after.logprobs != before.logprobs
    assert after.weight_version == 1
    held = dict(engine.named_weights())
    assert digest_of((n, held[n]) for n, _ in trainer_tensors) == digest_of(trainer_tensors)


def test_bad_weight_update_is_refused_whole(engine: TorchEngine) -> None:
    held = dict(engine.named_weights())
    name = next(iter(held))
    snapshot = held[name].clone()
    update = [(name, torch.zeros_like(snapshot)), ("no.such.weight", torch.zeros(2))]
    with pytest.raises(EngineError, match="unknown tensor"):
        engine.update_weights_from_tensor(update, version=5)
    assert engine.weight_version == 0 and torch.equal(dict(engine.named_weights())[name], snapshot)


def test_update_from_disk_and_in_place_versions(engine: TorchEngine, tmp_path: Path) -> None:
    other_dir = make_tiny_model(tmp_path / "other", seed=2)
    long = engine.submit(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=300))
    while engine.stats().generated_tokens == 0:
        time.sleep(0.001)
    engine.pause()                                                # between two decode steps
    assert not long.done()
    engine.update_weights_from_disk(str(other_dir), version=3)
    engine.resume()                                               # the sequence continues under version 3
    gen = long.result(timeout=60)
    assert gen.weight_version == 0 and gen.token_versions[0] == 0 and gen.token_versions[-1] == 3
    assert sorted(set(gen.token_versions)) == [0, 3]


def test_abort_resolves_in_flight_requests(engine: TorchEngine) -> None:
    engine.pause()
    futures = [engine.submit(p, SamplingParams(temperature=0, max_new_tokens=5)) for p in PROMPTS[:2]]
    assert engine.abort_in_flight() == 2
    assert [f.result(timeout=5).finish_reason for f in futures] == ["abort", "abort"]
    engine.resume()


def test_fast_decode_matches_the_hf_decode_path(model_dir: Path) -> None:
    """The lean Llama decode step (fast_decode.py) gives the HF modules' ids and logprobs, batch joins included."""
    fast, plain = TorchEngine(model_dir, max_batch_size=3), TorchEngine(model_dir, max_batch_size=3, fast_decode=False)
    try:
        assert isinstance(fast._decoder, FastDecoder) and isinstance(plain._decoder, HFDecoder)
        assert_engines_agree(fast, plain, PROMPTS, (SamplingParams(temperature=0, max_new_tokens=6),
                                                    SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)),
                             staggered)
    finally:
        fast.shutdown()
        plain.shutdown()


@pytest.mark.parametrize(("fast_decode", "on_policy", "lean"), [(True, False, True), (False, False, False),
                                                                 (True, True, False)])
def test_the_decoder_is_chosen_once_when_the_model_loads(model_dir: Path, fast_decode: bool, on_policy: bool,
                                                        lean: bool) -> None:
    """A llama decodes through the lean path unless fast_decode is off or the engine is on-policy (HF modules)."""
    eng = TorchEngine(model_dir, max_batch_size=2, fast_decode=fast_decode, on_policy=on_policy)
    try:
        assert isinstance(eng._decoder, FastDecoder if lean else HFDecoder)
        assert eng.submit(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=3)).result(timeout=60).output_ids
    finally:
        eng.shutdown()


@pytest.mark.parametrize("fast_decode", [True, False])    # the packed prefill (fast_prefill.py) and the HF forward
def test_a_groups_equal_prompts_are_prefilled_once_with_the_same_results(model_dir: Path, hf: torch.nn.Module,
                                                                          fast_decode: bool) -> None:
    eng = TorchEngine(model_dir, max_batch_size=16, fast_decode=fast_decode)
    embedded: list[int] = []                       # token ids the model embeds per call: the prefill's come first
    hook = eng.model.get_input_embeddings().register_forward_hook(lambda _m, args, _o: embedded.append(args[0].numel()))
    try:
        eng.pause()                                # admit the two groups together
        greedy = [eng.submit(PROMPTS[2], SamplingParams(temperature=0, max_new_tokens=6)) for _ in range(4)]
        sampled = [eng.submit(PROMPTS[4], SamplingParams(temperature=1.0, max_new_tokens=6, seed=20 + i))
                   for i in range(4)]
        eng.resume()
        with torch.no_grad():
            ref = hf.generate(torch.tensor([PROMPTS[2]]), max_new_tokens=6, do_sample=False)[0, len(PROMPTS[2]):]
        for f in greedy:
            assert list(f.result(timeout=60).output_ids) == ref.tolist()
        outs = [f.result(timeout=60) for f in sampled]
        for gen in outs:
            expected = teacher_forced(hf, PROMPTS[4], gen.output_ids, 1.0)
            assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-5, rtol=0)
        assert len({g.output_ids for g in outs}) > 1                 # the copies sample independently
        alone = eng.submit(PROMPTS[4], SamplingParams(temperature=1.0, max_new_tokens=6, seed=21)).result(timeout=60)
        assert alone.output_ids == outs[1].output_ids                # and as each would alone
    finally:
        hook.remove()
        eng.shutdown()
    distinct = (PROMPTS[2], PROMPTS[4])               # 8 requests, 2 distinct prompts: the prefill embeds those 2
    assert sum(map(len, distinct)) <= embedded[0] <= 2 * max(map(len, distinct))   # packed, or padded to one length


def test_a_folder_without_a_model_is_refused_by_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="cannot load a causal LM"):     # the load runs on the engine thread
        TorchEngine(tmp_path)


def test_call_runs_on_the_engine_thread_between_steps(engine: TorchEngine) -> None:
    """Tensor work handed to the engine runs on the thread that loaded the model, paused or not; its result and its
    errors come back to the caller; after shutdown nothing runs."""
    import threading

    loader = engine.call(threading.current_thread)
    assert loader is not threading.current_thread() and loader.name == "torch-engine"
    engine.pause()
    assert engine.call(lambda: engine.model.get_input_embeddings().weight.shape[0]) == engine.vocab_size
    with pytest.raises(ZeroDivisionError):
        engine.call(lambda: 1 / 0)
    engine.resume()
    assert engine.submit(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=3)).result(timeout=60).output_ids
    engine.shutdown()
    with pytest.raises(EngineError, match="shut down"):
        engine.call(lambda: None)


def test_a_held_burst_waits_whole_while_running_rows_go_on(model_dir: Path) -> None:
    eng = TorchEngine(model_dir, max_batch_size=8)
    try:
        greedy = SamplingParams(temperature=0, max_new_tokens=4)
        alone = [eng.submit(p, greedy).result(timeout=60).output_ids for p in PROMPTS[:3]]
        long = eng.submit(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=3000))     # greedy: no EOS
        while eng.stats().running == 0:
            time.sleep(0.01)
        with eng.admission_held():
            with eng.admission_held():                       # nested: only the outermost release admits
                burst = [eng.submit(p, greedy) for p in PROMPTS[:3]]
            tokens = eng.stats().generated_tokens
            time.sleep(0.3)
            held = eng.stats()
            assert held.waiting == 3 and not any(f.done() for f in burst)
            assert held.generated_tokens > tokens and not long.done()     # the running row kept decoding
        assert [f.result(timeout=60).output_ids for f in burst] == alone     # the same ids as unheld
        eng.abort_in_flight()
    finally:
        eng.shutdown()
