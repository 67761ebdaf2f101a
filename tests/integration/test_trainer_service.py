"""`python -m rlfleet.services.trainer` against in-test Buffer, WeightSync and Rollout gRPC servers on loopback:
acks follow checkpoints, publishes carry the trainer's exact weights, eval runs before and after, a resumed trainer
continues from its checkpoint, and a failing peer ends the run with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import yaml

from rlfleet.protocols import Prompt
from rlfleet.runtime.metrics import read_jsonl
from rlfleet.runtime.ports import free_ports
from rlfleet.runtime.rpc import Server
from rlfleet.sample import Sample
from rlfleet.sample.packed_arrays import pack_f32, pack_i32
from rlfleet.services.weight_sync.transports.bucketed import fetch
from rlfleet.services.weight_sync.transports.manifest import digest_of, manifest_digest, manifest_pairs
from rlfleet.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    weight_sync_pb2,
    weight_sync_pb2_grpc,
    weights_pb2,
)
from rlfleet.weights.tied import tied_aliases
from tests.support.tiny_model import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token"
GROUPS = 2
LABELS = ["2", "4", "6", "8"]          # the fake rollout always answers "2": pass rate 1/4


# -- plugins the trainer process loads by dotted path ---------------------------------------------------------------

def eval_prompts(count: int = 4) -> list[Prompt]:
    return [Prompt(index=i, text=f"{i + 1}+{i + 1}=", label=LABELS[i]) for i in range(count)]


def exact_match(prompt: Prompt, completion: str, sample: Sample) -> float:
    assert sample.prompt_ids and sample.response_ids
    return 1.0 if completion.strip() == prompt.label else 0.0


class RecordingHook:
    """Appends each hook call to $TRAINER_HOOK_LOG.<rank>."""

    def __init__(self) -> None:
        self.path = Path(f"{os.environ['TRAINER_HOOK_LOG']}.{os.environ['RANK']}")

    def _log(self, *what: object) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(what) + "\n")

    def after_model_init(self, model: torch.nn.Module) -> None:
        self._log("after_model_init", type(model).__name__)

    def before_logprobs(self, batch: Any) -> None:
        self._log("before_logprobs", len(batch.sample_ids))

    def before_step(self, step: int, batch: Any) -> None:
        self._log("before_step", step)

    def after_save(self, step: int, path: str) -> None:
        self._log("after_save", step, Path(path).name)


# -- fake peers -----------------------------------------------------------------------------------------------------

def batch_for(step: int) -> buffer_pb2.Batch:
    samples, gids = [], []
    for g in range(GROUPS):
        gid = f"s{step}g{g}"
        gids.append(gid)
        for i in range(2):
            resp = [4 + (step + g + i) % 10, 5 + i, 2]
            samples.append(Sample(group_id=gid, index=i, group_size=2, prompt_ids=[1, 5, 14, 5, 15],
                                  response_ids=resp, rollout_logprobs=[-2.0, -2.5, -3.0], reward=float(i),
                                  weight_version=step).to_proto())
    return buffer_pb2.Batch(step=step, samples=samples, group_ids=gids, complete=True)


class FakeBuffer(buffer_pb2_grpc.BufferServicer):
    def __init__(self, run_dir: Path, events: list[tuple], fail_at_step: int | None = None) -> None:
        self.run_dir, self.events, self.fail_at_step = run_dir, events, fail_at_step
        self.asked: set[int] = set()
        self.committed = -1

    def _acked(self, step: int, via: str) -> None:
        ckpts = sorted(p.name for p in (self.run_dir / "checkpoints").glob("step_*"))
        self.events.append(("ack", step, ckpts, via))
        self.committed = max(self.committed, step)

    def Stats(self, request: buffer_pb2.StatsRequest, context: grpc.ServicerContext) -> buffer_pb2.BufferStats:
        return buffer_pb2.BufferStats(committed_step=self.committed)

    def TrainerResume(self, request: buffer_pb2.TrainerResumeRequest,
                      context: grpc.ServicerContext) -> buffer_pb2.TrainerResumeReply:
        committed = self.committed
        if request.checkpoint_step > committed:       # a start from a checkpoint acks its steps
            self._acked(request.checkpoint_step, "TrainerResume")
        return buffer_pb2.TrainerResumeReply(committed_step=committed)

    def GetBatch(self, request: buffer_pb2.GetBatchRequest, context: grpc.ServicerContext) -> buffer_pb2.Batch:
        if request.HasField("ack_through_step"):      # the Ack folded into GetBatch
            self._acked(request.ack_through_step, "GetBatch")
        if request.step == self.fail_at_step:
            context.abort(grpc.StatusCode.INTERNAL, "the store is gone")
        if request.step not in self.asked:           # the first ask of each step finds no batch ready yet
            self.asked.add(request.step)
            return buffer_pb2.Batch(step=request.step, complete=False)
        self.events.append(("get", request.step, request.policy_version, request.num_groups))
        self.events.append(("lineage", request.step, [(e.epoch, e.base_version) for e in request.lineage]))
        return batch_for(request.step)

    def Ack(self, request: buffer_pb2.AckRequest, context: grpc.ServicerContext) -> buffer_pb2.AckReply:
        self._acked(request.committed_step, "Ack")
        return buffer_pb2.AckReply(acked_samples=4)


class FakeWeightSync(weight_sync_pb2_grpc.WeightSyncServicer):
    def __init__(self, events: list[tuple]) -> None:
        self.events = events

    def Publish(self, manifest: weights_pb2.WeightManifest, context: grpc.ServicerContext
                ) -> weight_sync_pb2.PublishReply:
        tensors = fetch(manifest, TOKEN, 30.0, "test")         # checks every tensor hash and the digest
        self.events.append(("publish", manifest.version, manifest.step, manifest,
                            {name: t.clone() for name, t in tensors}))
        return weight_sync_pb2.PublishReply(subscribers=1)

    def Verify(self, request: weight_sync_pb2.VerifyRequest, context: grpc.ServicerContext
               ) -> weight_sync_pb2.VerifyReply:
        self.events.append(("verify", request.version))
        return weight_sync_pb2.VerifyReply(version=request.version, all_current=True)


class FakeRollout(rollout_pb2_grpc.RolloutServicer):
    def __init__(self, events: list[tuple]) -> None:
        self.events = events

    def Generate(self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext
                 ) -> rollout_pb2.GenerateReply:
        self.events.append(("generate", len(request.input_ids), request.min_version, request.sampling.temperature,
                            request.sampling.max_new_tokens))
        gens = [rollout_pb2.Generation(output_ids=pack_i32([6, 2]), logprobs=pack_f32([-0.1, -0.2]),
                                       finish_reason="stop", weight_version=request.min_version)
                for _ in request.input_ids]
        return rollout_pb2.GenerateReply(generations=gens)



class Peers:
    def __init__(self, run_dir: Path, fail_at_step: int | None = None) -> None:
        self.events: list[tuple] = []
        self.servers = []
        for register, servicer, name in (
                (buffer_pb2_grpc.add_BufferServicer_to_server, FakeBuffer(run_dir, self.events, fail_at_step),
                 "rlfleet.v1.Buffer"),
                (weight_sync_pb2_grpc.add_WeightSyncServicer_to_server, FakeWeightSync(self.events),
                 "rlfleet.v1.WeightSync"),
                (rollout_pb2_grpc.add_RolloutServicer_to_server, FakeRollout(self.events), "rlfleet.v1.Rollout")):
            server = Server("127.0.0.1:0", TOKEN, max_workers=4)
            server.add(register, servicer, name)
            server.start()
            self.servers.append(server)

    def endpoints(self) -> dict[str, Any]:
        b, w, r = (f"127.0.0.1:{s.port}" for s in self.servers)
        return {"buffer": b, "weight_sync": w, "rollout": [r], "trainer": f"127.0.0.1:{free_ports(1)[0]}",
                "trainer_data": f"127.0.0.1:{free_ports(1)[0]}", "rendezvous": ""}

    def stop(self) -> None:
        for s in self.servers:
            s.stop(0)

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


def _write_config(tmp_path: Path, peers: Peers, model_dir: Path, name: str, **trainer: Any) -> Path:
    (tmp_path / "token").write_text(TOKEN)
    resume = trainer.pop("resume", False)
    endpoints = trainer.pop("endpoints", {})
    signing: dict[str, str] = {}
    if trainer.pop("signed", False):                 # checkpoints sealed, resume verifies the seal
        from rlfleet.security.signing import generate_signing_key

        key, pub = tmp_path / "signing.pem", tmp_path / "signing.pub"
        if not key.exists():
            generate_signing_key(key, pub)
        signing = {"signing_key": str(key), "signing_public_key": str(pub)}
    cfg = {
        "run": {"name": "t", "dir": str(tmp_path / "run"), "resume": resume},
        "model": {"path": str(model_dir)},
        "rollout": {"data_source": "tests.integration.test_trainer_service:eval_prompts",
                    "reward_fn": "tests.integration.test_trainer_service:exact_match", "group_size": 2,
                    "sampling": {"temperature": 1.0, "max_new_tokens": 4}},
        "trainer": {"groups_per_step": GROUPS, "lr": 1e-3, "publish_every": 1, "checkpoint_every": 2,
                    "keep_checkpoints": 2, **trainer},
        "weight_sync": {"bucket_mb": 0.05, "chunk_kb": 16},
        "eval": {"data_source": "tests.integration.test_trainer_service:eval_prompts", "max_new_tokens": 3},
        "security": {"mode": "token", "token_file": str(tmp_path / "token"), **signing},
        "endpoints": {**peers.endpoints(), **endpoints},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(rank: int, world: int, **extra: str) -> dict[str, str]:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), **extra}
    env.pop("RLFLEET_TOKEN", None)
    return env


def _run_trainer(tmp_path: Path, peers: Peers, model_dir: Path, name: str,
                 **trainer: Any) -> subprocess.CompletedProcess:
    path = _write_config(tmp_path, peers, model_dir, name, **trainer)
    return subprocess.run([sys.executable, "-m", "rlfleet.services.trainer", "--config", str(path)], cwd=ROOT,
                          env=_env(0, 1), capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(400)
def test_trainer_process_trains_publishes_checkpoints_acks_and_resumes(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = make_tiny_model(tmp_path / "model")
    run_dir = tmp_path / "run"
    peers = Peers(run_dir)
    try:
        proc = _run_trainer(tmp_path, peers, model_dir, "first", steps=3, signed=True)
    finally:
        peers.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]

    # batches: every step asked again until complete, under the version published after the previous step
    assert [e[1:] for e in peers.of("get")] == [(0, 0, GROUPS), (1, 1, GROUPS), (2, 2, GROUPS)]

    # publishes: version 0 (initial weights) then one per step; manifests carry what the trainer holds
    publishes = peers.of("publish")
    assert [(e[1], e[2]) for e in publishes] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tied = tied_aliases(hf)                            # sent once, under the name of the tensor they alias
    initial = {k: v for k, v in hf.state_dict().items() if k not in tied}
    v0 = publishes[0][4]
    assert list(v0) == list(initial)
    assert all(torch.equal(v0[k], initial[k]) for k in initial)
    for _, _, _, manifest, tensors in publishes:
        assert manifest.transport == "bucketed" and manifest.num_buckets > 1
        assert manifest.digest == manifest_digest(manifest_pairs(manifest)) == digest_of(tensors.items())
    assert publishes[1][3].digest != publishes[0][3].digest

    # acks only after the checkpoint of that step exists, and after that step's publish
    acks = peers.of("ack")
    assert [(a[1], a[2]) for a in acks] == [(1, ["step_00000001"]), (2, ["step_00000001", "step_00000002"])]
    assert [a[3] for a in acks] == ["GetBatch", "Ack"]   # mid-run: on the next GetBatch; after the last step: Ack
    order = [(e[0], e[1]) for e in peers.events if e[0] in ("ack", "publish", "get")]
    assert order.index(("publish", 2)) < order.index(("ack", 1)) < order.index(("get", 2))

    # eval before and after training, greedy, on the current version: the 4 prompts in requests of 2 sent at once
    # (each answered request moves the evaluation's progress line)
    assert [g[1:] for g in peers.of("generate")] == [(2, 0, 0.0, 3)] * 2 + [(2, 3, 0.0, 3)] * 2
    records = read_jsonl(run_dir / "metrics" / "trainer.jsonl")
    evals = [r for r in records if "eval/pass_rate" in r]
    assert [(r["step"], r["eval/pass_rate"], r["eval/reward_mean"]) for r in evals] == [(0, 0.25, 0.25),
                                                                                       (3, 0.25, 0.25)]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [0, 1, 2] and [r["version"] for r in steps] == [1, 2, 3]
    for key in ("reward_mean", "ratio_mean", "clip_fraction", "tis_weight_mean", "tis_clip_fraction",
                "logprob_abs_diff", "samples", "tokens", "step_seconds", "wait_seconds", "samples_per_s"):
        assert key in steps[0], key
    assert steps[0]["samples"] == 2 * GROUPS and steps[0]["reward_mean"] == 0.5
    done = json.loads((run_dir / "trainer_done.json").read_text())
    assert (done["version"], done["committed_step"]) == (3, 2)
    assert done["eval_after"]["eval/pass_rate"] == 0.25

    # resume with more steps (from the sealed checkpoint of step 2: its seal covers hf/model.safetensors, so it
    # verifies); the buffer fails at step 5 -> a clear error and a non-zero exit
    peers2 = Peers(run_dir, fail_at_step=5)
    try:
        proc = _run_trainer(tmp_path, peers2, model_dir, "second", steps=7, resume=True, signed=True)
    finally:
        peers2.stop()
    assert proc.returncode == 1
    assert "Buffer.GetBatch" in proc.stderr.strip().splitlines()[-1]
    assert "INTERNAL" in proc.stderr.strip().splitlines()[-1]
    first = [(e[0], e[1]) for e in peers2.events if e[0] in ("ack", "publish", "get")]
    assert first[:4] == [("ack", 2), ("publish", 3), ("get", 3), ("publish", 4)]
    resumed = peers2.of("publish")[0]
    assert resumed[3].digest == publishes[-1][3].digest          # exactly the weights the first run ended with
    assert [(a[1], a[2][-1], a[3]) for a in peers2.of("ack")] == [(2, "step_00000002", "TrainerResume"),
                                                                   (3, "step_00000003", "GetBatch")]

    # lineage: the first incarnation from version 0; the resumed one joins it at the version it resumed (3), and
    # both name it in every GetBatch (stored in run/trainer/lineage.json)
    first_epoch, second_epoch = publishes[0][3].epoch, resumed[3].epoch
    assert second_epoch > first_epoch > 0
    assert {tuple(map(tuple, e[2])) for e in peers.of("lineage")} == {((first_epoch, 0),)}
    assert {tuple(map(tuple, e[2])) for e in peers2.of("lineage")} == {((first_epoch, 0), (second_epoch, 3))}
    stored = json.loads((run_dir / "trainer" / "lineage.json").read_text())["lineage"]
    assert [(r["epoch"], r["base_version"]) for r in stored] == [(first_epoch, 0), (second_epoch, 3)]


@pytest.mark.timeout(300)
def test_two_rank_trainer_runs_hooks_and_stops_every_rank_when_rank0_fails(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "model")
    run_dir = tmp_path / "run"
    peers = Peers(run_dir, fail_at_step=2)
    hook_log = tmp_path / "hooks"
    path = _write_config(tmp_path, peers, model_dir, "two", steps=4, world_size=2, checkpoint_every=1,
                         hooks=["tests.integration.test_trainer_service:RecordingHook"],
                         endpoints={"rendezvous": f"127.0.0.1:{free_ports(1)[0]}"})
    procs = [subprocess.Popen([sys.executable, "-m", "rlfleet.services.trainer", "--config", str(path)], cwd=ROOT,
                              env=_env(rank, 2, TRAINER_HOOK_LOG=str(hook_log)), stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        peers.stop()
    assert procs[0].returncode == 1 and "Buffer.GetBatch" in errs[0].strip().splitlines()[-1], errs[0][-2000:]
    assert procs[1].returncode == 1, errs[1][-2000:]
    assert errs[1].strip().splitlines()[-1].startswith("trainer rank 1:")

    assert [e[1:] for e in peers.of("get")] == [(0, 0, GROUPS), (1, 1, GROUPS)]
    assert [(e[1], e[2]) for e in peers.of("publish")] == [(0, 0), (1, 0), (2, 1)]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tied = tied_aliases(hf)
    initial = {k: v for k, v in hf.state_dict().items() if k not in tied}
    v0 = peers.of("publish")[0][4]                     # gathered per parameter from both ranks' shards
    assert list(v0) == list(initial) and all(torch.equal(v0[k], initial[k]) for k in initial)
    assert [(a[1], a[2][-1]) for a in peers.of("ack")] == [(0, "step_00000000"), (1, "step_00000001")]
    info = json.loads((run_dir / "checkpoints" / "step_00000001" / "meta.json").read_text())
    assert (info["step"], info["version"], info["world_size"]) == (1, 2, 2)
    for rank in (0, 1):
        calls = [json.loads(line) for line in Path(f"{hook_log}.{rank}").read_text().splitlines()]
        assert calls == [["after_model_init", "LlamaForCausalLM"],
                         ["before_logprobs", 2], ["before_step", 0], ["after_save", 0, "step_00000000"],
                         ["before_logprobs", 2], ["before_step", 1], ["after_save", 1, "step_00000001"]]
