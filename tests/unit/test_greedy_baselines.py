"""ReMax's greedy baseline through the real rollout path (ServiceContext + TorchEngine + the work loop, on the
collector thread and on a thread per group): every put sample of a group carries, as reward_baseline, the reward of
the greedy completion of its prompt, computed here independently (the engine run greedily on the prompt, scored by
the same reward function), and the greedy completion itself is never put, so the trained batch holds only the
group's sampled responses."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
import torch
from transformers import AutoTokenizer

from rlfleet.protocols import GroupTicket, Prompt, SamplingParams
from rlfleet.rewards.scorer import Scorer
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.context import ServiceContext
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.group_samples import set_baseline
from rlfleet.services.rollout.rollout_fns import single_turn
from rlfleet.services.rollout.work_loop import SamplePutter, WorkLoop, WorkSettings
from rlfleet.services.trainer.batch import build_train_batch
from rlfleet.services.trainer.reward_baselines import REWARD_BASELINES
from tests.unit.test_single_turn_groups import RecordingStub

torch.set_num_threads(1)
SETTINGS = WorkSettings(replica_id="r0", run_id="run", claim_groups=8)
PROMPTS = {i: Prompt(index=i, text=f"{i}+{3 * i}=") for i in range(3)}
GROUP = 3
MAX_NEW = 5


def token_reward(prompt: Prompt, completion: str, sample: Sample) -> dict[str, float]:
    """Depends on which tokens were chosen (not only how many), so a sampled response's reward is not the greedy's."""
    ids = sample.response_ids
    return {"tokens": float(sum((i + 1) * t for i, t in enumerate(ids)) % 97), "prompt": float(prompt.index)}


def greedy_reward(engine: TorchEngine, tok: object, prompt: Prompt) -> float:
    """The reference: the engine at temperature 0 on the prompt's tokens, scored by token_reward."""
    ids = [int(t) for t in tok.encode(prompt.text)]                              # type: ignore[attr-defined]
    gen = engine.submit(ids, SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW)).result(timeout=60)
    parts = token_reward(prompt, "", Sample(group_id="ref", index=0, group_size=1, prompt_ids=ids,
                                            response_ids=list(gen.output_ids), rollout_logprobs=list(gen.logprobs)))
    return sum(parts.values())


@pytest.mark.parametrize("collector", [True, False], ids=["collector", "thread_per_group"])
def test_each_group_carries_its_greedy_reward_and_the_greedy_response_is_not_put(
        tiny_engine: TorchEngine, tiny_model_dir: Path, collector: bool) -> None:
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ctx = ServiceContext("r0", tiny_engine, tok, SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW),
                         Scorer(token_reward, 30.0), run_seed=11, reward_baselines=True)
    stub = RecordingStub()
    with grpc.insecure_channel("127.0.0.1:1") as ch:
        loop = WorkLoop(ch, tiny_engine, ctx, PROMPTS, single_turn, SETTINGS, threading.Event(), collector=collector)
    loop._putter = SamplePutter(stub.Put, SETTINGS, threading.Event())
    assert (loop._collector is not None) == collector
    for i in PROMPTS:
        loop._start(GroupTicket(group_id=f"g{i}", prompt_index=i, group_size=GROUP))
    deadline = time.monotonic() + 60
    while loop.in_flight_groups and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.close()
    put = [s for p in stub.puts for s in p]
    assert sorted((s.group_id, s.index) for s in put) == [(f"g{i}", k) for i in PROMPTS for k in range(GROUP)]
    want = {f"g{i}": greedy_reward(tiny_engine, tok, p) for i, p in PROMPTS.items()}
    for s in put:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED)
        assert s.reward_baseline == want[s.group_id]
    # the sampled responses are not all the greedy one (else this test could not tell them apart)
    assert any(s.reward != s.reward_baseline for s in put)
    batch = build_train_batch(put)                      # what the trainer trains on: the put samples only
    assert batch.input_ids.shape[0] == len(PROMPTS) * GROUP
    assert batch.extras[REWARD_BASELINES].tolist() == [want[s.group_id] for s in put]


def test_a_greedy_response_that_failed_fails_its_group() -> None:
    def sample(index: int, status: Status = Status.COMPLETED) -> Sample:
        return Sample(group_id="g", index=index, group_size=2, prompt_ids=[1], response_ids=[2],
                      rollout_logprobs=[-0.1], reward=1.0, status=status)

    group = [sample(0), sample(1, Status.ABORTED)]
    set_baseline(group, sample(2, Status.COMPLETED))
    assert [s.reward_baseline for s in group] == [1.0, 1.0]
    group = [sample(0), sample(1, Status.ABORTED)]
    failed = sample(2, Status.FAILED)
    failed.status_reason = "engine raised RuntimeError: boom"
    set_baseline(group, failed)
    assert [s.status for s in group] == [Status.FAILED, Status.ABORTED]
    assert group[0].status_reason == "the greedy baseline response failed: FAILED engine raised RuntimeError: boom"
    assert [s.reward_baseline for s in group] == [None, None]
