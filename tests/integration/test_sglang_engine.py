"""The SGLang engine against a real SGLang 0.5.23 server on CPU (float32, tiny llama), beside the built-in engine.

Must show: the same weights give identical greedy token ids and logprobs within 1e-5 on both engines, before and
after a weight update through each SGLang weight path (disk, distributed over gloo); the digest the replica
acknowledges is of what the server serves (read back), equal to the digest of what was sent.
Needs .venv-sglang (bash scripts/install_sglang_cpu.sh); one server for the module (start-up ~30 s on a quiet box).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rlfleet.protocols import Generation, SamplingParams
from rlfleet.services.rollout.engines.base import Engine
from rlfleet.services.rollout.engines.sglang.client import SGLangClient
from rlfleet.services.rollout.engines.sglang.engine import SGLangEngine, WeightPath
from rlfleet.services.rollout.engines.sglang.protocol import generate_body
from rlfleet.services.rollout.engines.sglang.server import SGLangServer
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.weight_sync.transports.manifest import digest_of
from tests.support.requires import requires
from tests.support.sglang_stub import (
    INSTALL_HINT,
    STUB_DIR,
    make_sglang_tiny_model,
    server_spec,
    sglang_python,
    tiny_llama_state,
)

PYTHON = sglang_python()
pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1200),
              requires(None if PYTHON else f"no SGLang venv: {INSTALL_HINT}")]

PROMPTS = [[1, 5, 6, 14, 7], [1, 9, 9, 9], [1, 4, 15, 4, 16], [1, 12, 10, 13, 11, 14, 8, 5]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)
TOL = 1e-5
# Served float32 logprobs against the exact (float64) teacher-forced values. SGLang decodes one token at a time, in
# a batch with whatever else it runs, so its float32 roundings differ from any one reference's: measured against
# float64 on this tiny llama (|logits| up to ~8, float32 spacing ~1e-6 there), up to 7e-6 alone and 2e-5 batched
# with 3 others (36 samples). At 1e-5 the sampled tokens' tail failed now and then; what this test guards against
# (logprobs of other weights, of a shifted position, of a tempered distribution) is off by more than 1e-2.
SAMPLED_TOL = 1e-4


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TorchEngine, SGLangEngine]]:
    root = tmp_path_factory.mktemp("sglang")
    model = make_sglang_tiny_model(root / "model")
    assert PYTHON is not None
    server = SGLangServer(server_spec(model, PYTHON), log_path=root / "server.log")
    server.start(ready_timeout=900)
    sgl = SGLangEngine(SGLangClient(server.url, generate_timeout=300), model, work_dir=root / "weights",
                       max_concurrency=8, server=server)
    built_in = TorchEngine(model, dtype="float32", max_batch_size=8)
    try:
        yield built_in, sgl
    finally:
        built_in.shutdown()
        sgl.shutdown()


def _run_all(engine: Engine, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
    futures = [engine.submit(p, sampling) for p in prompts]
    return [f.result(timeout=300) for f in futures]


def _run_alone(engine: Engine, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
    return [engine.submit(p, sampling).result(timeout=300) for p in prompts]


def assert_greedy_parity(built_in: TorchEngine, sgl: SGLangEngine) -> float:
    """Identical ids, logprobs within TOL, for every prompt; returns the largest logprob difference.

    Each prompt runs alone on each engine. Submitted together, which requests share a decode batch depends on
    timing, and so do both engines' float32 roundings: the difference then reached 1.4e-5 in one full run in eight.
    Alone, each engine's result is deterministic, so the comparison is too."""
    ours, theirs = _run_alone(built_in, PROMPTS, GREEDY), _run_alone(sgl, PROMPTS, GREEDY)
    worst = 0.0
    for prompt, a, b in zip(PROMPTS, ours, theirs, strict=True):
        assert b.output_ids == a.output_ids, f"prompt {prompt}: torch {a.output_ids} sglang {b.output_ids}"
        assert b.finish_reason == a.finish_reason
        diff = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
        worst = max(worst, diff)
    assert worst <= TOL, f"logprobs differ by {worst:.3g} > {TOL}"
    return worst


def _update_both(built_in: TorchEngine, sgl: SGLangEngine, seed: int, version: int) -> str:
    _, state = tiny_llama_state(seed)
    named = list(state.items())
    built_in.update_weights_from_tensor(named, version)
    sgl.update_weights_from_tensor(named, version)
    return digest_of(named)


def test_greedy_ids_and_logprobs_match_the_built_in_engine(engines: tuple[TorchEngine, SGLangEngine]) -> None:
    built_in, sgl = engines
    worst = assert_greedy_parity(built_in, sgl)
    print(f"initial weights: ids identical, max |logprob diff| {worst:.2e}")


@pytest.mark.parametrize(("weight_path", "seed", "version"), [("disk", 1, 1), ("distributed", 2, 2)])
def test_weight_update_keeps_parity_and_digest(engines: tuple[TorchEngine, SGLangEngine], weight_path: WeightPath,
                                               seed: int, version: int) -> None:
    built_in, sgl = engines
    sgl.weight_path = weight_path
    sent = _update_both(built_in, sgl, seed, version)
    assert sgl.weight_version == version
    names = [n for n, _ in tiny_llama_state(seed)[1].items()]
    served = dict(sgl.named_weights())
    assert digest_of((n, served[n]) for n in names) == sent          # read back from the server, not what was sent
    worst = assert_greedy_parity(built_in, sgl)
    gen = sgl.submit(PROMPTS[0], GREEDY).result(timeout=300)
    assert set(gen.token_versions) == {version}
    print(f"after {weight_path} update to v{version}: ids identical, max |logprob diff| {worst:.2e}")


def test_pause_holds_requests_and_update_lands_mid_generation(engines: tuple[TorchEngine, SGLangEngine]) -> None:
    _, sgl = engines
    old = sgl.weight_version
    sgl.pause()
    try:
        future = sgl.submit(PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=200, stop_token_ids=()))
        time.sleep(2.0)
        assert not future.done()                                      # paused: nothing generated
        assert sgl.stats().running + sgl.stats().waiting == 1
    finally:
        sgl.resume()
    time.sleep(0.3)
    sgl.weight_path = "disk"
    _, state = tiny_llama_state(3)
    sgl.update_weights_from_tensor(list(state.items()), old + 1)     # paused in place, loaded, continued
    gen = future.result(timeout=300)
    assert gen.token_versions and list(gen.token_versions) == sorted(gen.token_versions)
    assert set(gen.token_versions) <= {old, old + 1}
    assert sgl.submit(PROMPTS[0], GREEDY).result(timeout=300).token_versions[0] == old + 1


def test_abort_resolves_every_request_and_frees_the_engine(engines: tuple[TorchEngine, SGLangEngine]) -> None:
    _, sgl = engines
    sgl.pause()
    try:
        futures = [sgl.submit(p, SamplingParams(temperature=1.0, max_new_tokens=200, seed=i))
                   for i, p in enumerate(PROMPTS)]
        time.sleep(1.0)
        assert sgl.abort_in_flight() == len(PROMPTS)
        assert all(f.result(timeout=60).finish_reason == "abort" for f in futures)
    finally:
        sgl.resume()
    assert sgl.stats().running == sgl.stats().waiting == 0
    assert sgl.submit(PROMPTS[0], GREEDY).result(timeout=300).finish_reason in ("stop", "length")
    assert sgl.healthy()


def test_real_answers_fit_sglang_schema(engines: tuple[TorchEngine, SGLangEngine]) -> None:
    """A recorded /generate answer of the real server decodes with SGLang's own GenerateResponse type."""
    _, sgl = engines
    body = generate_body(PROMPTS[0], SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=7), "schema-check")
    answer = sgl.client.generate(body)
    data = {"requests": [{"path": "/generate", "body": body}], "real_answers": [answer], "schema_only": True}
    out = subprocess.run([str(PYTHON), str(STUB_DIR / "contract_check.py")], input=json.dumps(data),
                         capture_output=True, text=True, timeout=300, check=True, env={"PYTHONPATH": str(STUB_DIR)})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == []
    assert result["decoded"] == [{"ids": answer["output_ids"], "n": len(answer["output_ids"])}]


def test_sampled_tokens_carry_the_served_models_logprobs(engines: tuple[TorchEngine, SGLangEngine]) -> None:
    """temperature 1: each sampled token's logprob equals a teacher-forced forward of the weights the server holds.
    (sampling_seed is only honoured by SGLang with --enable-deterministic-inference, a GPU attention-backend mode, so
    sampled ids are not compared across engines.)"""
    from transformers import LlamaForCausalLM

    _, sgl = engines
    gen = sgl.submit(PROMPTS[2], SamplingParams(temperature=1.0, max_new_tokens=12)).result(timeout=300)
    cfg, _ = tiny_llama_state(0)
    model = LlamaForCausalLM(cfg).eval()
    model.load_state_dict(dict(sgl.named_weights()))
    model = model.double()                                   # the exact value, not a second float32 rounding
    ids = torch.tensor([PROMPTS[2] + list(gen.output_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(PROMPTS[2]) - 1:-1], dim=-1)
    expected = logp.gather(1, torch.tensor(gen.output_ids).unsqueeze(1)).squeeze(1)
    served = torch.tensor(gen.logprobs, dtype=torch.float64)
    assert torch.allclose(expected, served, atol=SAMPLED_TOL, rtol=0), f"max diff {(expected - served).abs().max():.3g}"


def test_weights_folder_is_pruned(engines: tuple[TorchEngine, SGLangEngine]) -> None:
    _, sgl = engines
    folders = sorted(p.name for p in Path(sgl._work_dir).iterdir())
    assert len(folders) <= 2 and not any(name.endswith(".tmp") for name in folders)
    assert torch.isfinite(dict(sgl.named_weights())["lm_head.weight"]).all()
