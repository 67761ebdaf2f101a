"""A live rollout replica (`python -m rlfleet.services.rollout`) runs the calculator agent, written against the real
`openai`
client, on its own OpenAI endpoint: the multi-turn samples it puts carry the engine's exact ids and logprobs (tool
tokens masked out) and train. The endpoint is reachable from outside with the run's key only."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
import torch.distributed as dist
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfleet.config import TrainerConfig
from rlfleet.protocols import SamplingParams
from rlfleet.runtime.rpc import Server
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.messages import sample_seed
from rlfleet.services.rollout.openai_api.server import SESSION_HEADER
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.trainer.step import StepContext, train_step
from rlfleet.v1 import buffer_pb2_grpc, weight_sync_pb2_grpc
from tests.integration.test_rollout_service import (
    GROUP_SIZE,
    GROUPS,
    TOKEN,
    FakeBuffer,
    FakeWeightSync,
    finish_and_terminate,
    free_port,
    start_replica,
    stderr_of,
)
from tests.support.calculator_model import calculator_model_dir

torch.set_num_threads(1)
RUN_SEED, NEW_TOKENS = 5, 12


@pytest.fixture
def servers() -> Iterator[tuple[FakeBuffer, FakeWeightSync, str, str]]:
    buffer, weights = FakeBuffer(), FakeWeightSync()
    bsrv, wsrv = Server("127.0.0.1:0", TOKEN), Server("127.0.0.1:0", TOKEN)
    bsrv.add(buffer_pb2_grpc.add_BufferServicer_to_server, buffer, "rlfleet.v1.Buffer")
    wsrv.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server, weights, "rlfleet.v1.WeightSync")
    bsrv.start()
    wsrv.start()
    yield buffer, weights, f"127.0.0.1:{bsrv.port}", f"127.0.0.1:{wsrv.port}"
    bsrv.stop(0)
    wsrv.stop(0)


def _config(tmp: Path, model_dir: Path, buffer: str, weight_sync: str, rollout: str) -> Path:
    (tmp / "token").write_text(TOKEN)
    cfg = {
        "run": {"name": "oai", "dir": str(tmp / "run"), "seed": RUN_SEED},
        "model": {"path": str(model_dir)},
        "rollout": {"group_size": GROUP_SIZE, "data_source": "examples.calculator.data:train_prompts",
                    "reward_fn": "examples.calculator.reward:solved",
                    "rollout_fn": "examples.calculator.agent:calculator_agent",
                    "sampling": {"temperature": 1.0, "max_new_tokens": NEW_TOKENS}, "max_batch_size": 16,
                    "claim_groups": 2, "openai": {"enabled": True}},
        "security": {"mode": "token", "token_file": str(tmp / "token")},
        "endpoints": {"buffer": buffer, "weight_sync": weight_sync, "rollout": [rollout]},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _model_turns(sample: Sample) -> list[tuple[int, int]]:
    """(start, end) of each run of loss-mask-1 tokens in the response: the engine's turns."""
    assert sample.loss_mask is not None
    turns: list[tuple[int, int]] = []
    start: int | None = None
    for i, m in enumerate([*sample.loss_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            turns.append((start, i))
            start = None
    return turns


def test_calculator_agent_on_the_openai_client_trains(tmp_path: Path, servers: Any) -> None:
    buffer, _, buffer_addr, ws_addr = servers
    model_dir = calculator_model_dir()
    rollout_addr = f"127.0.0.1:{free_port()}"
    proc = start_replica(_config(tmp_path, model_dir, buffer_addr, ws_addr, rollout_addr))
    try:
        deadline = time.monotonic() + 120
        while len(buffer.samples) < GROUPS * GROUP_SIZE:
            assert proc.poll() is None, stderr_of(proc)
            assert time.monotonic() < deadline, "samples did not arrive"
            time.sleep(0.1)
        address = json.loads((tmp_path / "run" / "openai" / "rep-a.json").read_text())
        assert address["rollout"] == rollout_addr and address["base_url"].startswith("http://127.0.0.1:")
        # from outside the replica: the run's key (token mode: the run token) is needed, and is enough
        with openai.OpenAI(base_url=address["base_url"], api_key="wrong", max_retries=0) as bad, \
                pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1"}])
        with openai.OpenAI(base_url=address["base_url"], api_key=TOKEN, max_retries=0) as client:
            reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "12*7"}],
                                                   max_tokens=4, logprobs=True, extra_headers={SESSION_HEADER: "x"})
            choice = reply.choices[0]
            assert choice.logprobs is not None and choice.logprobs.content is not None
            assert choice.model_extra is not None
            assert len(choice.logprobs.content) == len(choice.model_extra["token_ids"])
        finish_and_terminate(proc, buffer, rollout_addr)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (tmp_path / "run" / "openai" / "rep-a.json").exists()       # removed when the endpoint stops

    samples = [Sample.from_proto(m) for _, m in sorted(buffer.samples.items())]
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    stop = tok.convert_tokens_to_ids("</calc>")
    assert not [s.status_reason for s in samples if s.status == Status.FAILED]
    multi = [s for s in samples if len(_model_turns(s)) >= 2]
    assert multi, "no episode called the tool and answered"
    reference = TorchEngine(model_dir, max_batch_size=8)
    try:
        for s in samples:
            turns = _model_turns(s)
            assert int(s.metadata["turns"]) == len(turns) >= 1
            for t, (start, end) in enumerate(turns):
                # each model turn is what the engine generates from the session's ids so far, with the agent's seed
                context = s.prompt_ids + s.response_ids[:start]
                seed = (sample_seed(RUN_SEED, s.group_id, s.index) + t) % 2**63
                ref = reference.submit(context, SamplingParams(
                    temperature=1.0, max_new_tokens=min(NEW_TOKENS, 64 - len(context)), stop_token_ids=(stop,),
                    seed=seed)).result(60)
                assert s.response_ids[start:end] == list(ref.output_ids)
                assert s.rollout_logprobs[start:end] == pytest.approx(list(ref.logprobs), abs=1e-5)
            for start, end in zip([e for _, e in turns], [b for b, _ in turns[1:]], strict=False):
                tool = tok.decode(s.response_ids[start:end], skip_special_tokens=False)
                assert "<|tool|><result>" in tool and set(s.rollout_logprobs[start:end]) == {0.0}
    finally:
        reference.shutdown()

    # the samples train: the trainer's logprobs of the model tokens are the engine's; a GRPO step is finite
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        batch = build_train_batch(samples, pad_id=tok.pad_token_id)
        with torch.no_grad():
            lp = forward_logprobs(model, batch, temperature=1.0)                          # [S, T]
        mask = batch.response_mask.bool()
        torch.testing.assert_close(lp[mask], batch.rollout_logprobs[mask], rtol=0, atol=2e-4)
        advantage_fn, loss_fn = resolve(TrainerConfig(algorithm="grpo"))
        ctx = StepContext(advantage_fn=advantage_fn, loss_fn=loss_fn, hooks=[], temperature=1.0, minibatches=1,
                          grad_clip=1.0, world_size=1, device=torch.device("cpu"), pad_id=tok.pad_token_id)
        groups = [[s for s in samples if s.group_id == g] for g in sorted({s.group_id for s in samples})]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        metrics = train_step(model, optimizer, lambda n: float(torch.nn.utils.clip_grad_norm_(model.parameters(), n)),
                             groups, 0, ctx)
        assert math.isfinite(metrics["loss"]) and metrics["samples"] == GROUPS * GROUP_SIZE
    finally:
        leave_distributed()
