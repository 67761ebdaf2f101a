"""Held-out evaluation: greedy generations from the rollout replicas, scored with the reward function.

Each evaluation reports its progress in RUN_DIR/progress/eval.json (the launcher prints it) and writes what it saw to
RUN_DIR/predictions/step_<N>.jsonl (prompt, greedy completion, label, reward per held-out row), so a user sees which
questions flipped between two evaluations; RUN_DIR/heldout.jsonl names the held-out rows once."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlfleet.config import Config
from rlfleet.data.files import FileDataSource, eval_source
from rlfleet.protocols import Prompt
from rlfleet.rewards.scorer import load_scorer
from rlfleet.run_dir.atomic import write_text_atomic
from rlfleet.runtime.progress import PhaseProgress, phase_file
from rlfleet.sample import Sample, Status
from rlfleet.sample.packed_arrays import pack_i32, unpack_f32, unpack_i32
from rlfleet.security.identity import Credential
from rlfleet.services.trainer.clients import PATIENCE, PeerError, RolloutClient
from rlfleet.v1 import rollout_pb2

log = logging.getLogger(__name__)

GENERATE_TIMEOUT = 900.0     # seconds for one replica's share (it may first wait for min_version)
# Seconds a replica may stay unreachable before it has answered once: the trainer starts beside the replicas, whose
# engine may take longer to start than the usual patience (an SGLang server on a busy CPU: 50-60 s measured); the
# launcher gives the replicas 300 s to become healthy, so the first eval waits as long. Once answered: PATIENCE.
STARTUP_PATIENCE = 300.0
PROGRESS_PARTS = 3           # requests at once per replica (more than rollout.max_batch_size prompts: more, in turn)


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids win; then chat messages (chat template); then text."""
    if prompt.token_ids is not None:
        return list(prompt.token_ids)
    if prompt.messages is not None:
        return list(tokenizer.apply_chat_template([dict(m) for m in prompt.messages], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False))
    if prompt.text is None:
        raise ValueError(f"eval prompt {prompt.index} has no token_ids, messages or text")
    return list(tokenizer.encode(prompt.text))


HELDOUT_FILE = "heldout.jsonl"        # RUN_DIR/heldout.jsonl: the held-out rows, one line each
PREDICTIONS_DIR = "predictions"       # RUN_DIR/predictions/step_<N>.jsonl: one evaluation's greedy completions


def prompt_json(prompt: Prompt) -> Any:
    """What a person reads as the prompt: its messages, else its text, else its token ids."""
    if prompt.messages is not None:
        return [dict(m) for m in prompt.messages]
    return prompt.text if prompt.text is not None else list(prompt.token_ids or [])


def prediction_row(prompt: Prompt, completion: str, reward: float, gen: rollout_pb2.Generation) -> dict[str, Any]:
    return {"index": prompt.index, "prompt": prompt_json(prompt), "completion": completion, "label": prompt.label,
            "reward": reward, "finish_reason": gen.finish_reason}


def write_heldout(path: Path, prompts: Sequence[Prompt], source: object) -> None:
    """The held-out rows: index, the file row (1-based, as `rlfleet check` names rows) when they come from a dataset
    file, prompt and label."""
    lines = []
    for p in prompts:
        row: dict[str, Any] = {"index": p.index}
        if isinstance(source, FileDataSource):
            row["file"], row["row"] = str(source.path), source.row_of(p.index) + 1
        row.update(prompt=prompt_json(p), label=p.label)
        lines.append(json.dumps(row) + "\n")
    write_text_atomic(path, "".join(lines))


class Evaluator:
    """Rank 0 only. Loads the eval prompts once; `run(version)` returns eval/* metrics."""

    def __init__(self, cfg: Config, token: Credential) -> None:
        from transformers import AutoTokenizer

        ev = cfg.eval
        if not cfg.endpoints.rollout:
            raise ValueError("an eval data set is configured but endpoints.rollout lists no replica")
        source = eval_source(cfg)
        assert source is not None
        name, args = cfg.eval_reward
        self.scorer = load_scorer(name, args, cfg.rollout.reward_timeout, "eval.reward_fn")
        self.tokenizer = AutoTokenizer.from_pretrained(str(cfg.model_path))
        self.prompts = [source[i] for i in range(min(len(source), ev.max_prompts))]
        self.encoded = [encode_prompt(self.tokenizer, p) for p in self.prompts]
        eos = self.tokenizer.eos_token_id
        self.sampling = rollout_pb2.SamplingParams(
            temperature=0.0, top_p=1.0, top_k=0,
            max_new_tokens=ev.max_new_tokens or cfg.rollout.sampling.max_new_tokens,
            stop_token_ids=pack_i32([eos] if eos is not None else []))
        self.clients = [RolloutClient(addr, token) for addr in cfg.endpoints.rollout]
        self.batch_size = cfg.rollout.max_batch_size
        self._answered: set[str] = set()                 # replicas that have answered a Generate
        self.run_dir = Path(cfg.run_dir)
        self._progress: PhaseProgress | None = None
        self._progress_lock = threading.Lock()
        write_heldout(self.run_dir / HELDOUT_FILE, self.prompts, source)

    def _generate(self, client: RolloutClient, rows: Sequence[int], version: int) -> list[rollout_pb2.Generation]:
        """The rows' greedy generations on one replica, in PROGRESS_PARTS requests sent at once (the engine batches
        them together, up to rollout.max_batch_size; a replica serves one caller at most 4 calls at a time): each
        answered request advances the progress line."""
        size = max(1, min(self.batch_size, -(-len(rows) // PROGRESS_PARTS)))
        chunks = [rows[lo:lo + size] for lo in range(0, len(rows), size)]
        if not chunks:
            return []
        patience = PATIENCE if client.address in self._answered else STARTUP_PATIENCE
        with ThreadPoolExecutor(max_workers=min(len(chunks), PROGRESS_PARTS), thread_name_prefix="eval-part") as pool:
            parts = list(pool.map(lambda c: self._request(client, c, version, patience), chunks))
        self._answered.add(client.address)
        return [g for part in parts for g in part]

    def _request(self, client: RolloutClient, chunk: Sequence[int], version: int,
                 patience: float) -> list[rollout_pb2.Generation]:
        req = rollout_pb2.GenerateRequest(input_ids=[pack_i32(self.encoded[i]) for i in chunk],
                                          sampling=self.sampling, min_version=version, return_logprobs=True)
        reply = client.generate(req, GENERATE_TIMEOUT, patience)
        if len(reply.generations) != len(chunk):
            raise RuntimeError(f"Rollout.Generate at {client.address} returned {len(reply.generations)} "
                               f"generations for {len(chunk)} prompts")
        if self._progress is not None:
            self._progress.advance(len(chunk))
        return list(reply.generations)

    def _generate_any(self, first: int, rows: Sequence[int], version: int) -> list[rollout_pb2.Generation]:
        """Generate on replica `first`; if it stays unreachable (dead, being restarted), on the next replicas."""
        errors: list[str] = []
        for j in range(len(self.clients)):
            client = self.clients[(first + j) % len(self.clients)]
            try:
                return self._generate(client, rows, version)
            except PeerError as exc:
                errors.append(str(exc))
                log.warning("evaluation: %s; trying the next replica", exc)
        raise PeerError("; ".join(errors))

    def run(self, version: int, step: int = 0, phase: str = "evaluation") -> dict[str, float]:
        """Evaluate the weights of `version`; `step`: the steps trained so far (names the predictions file),
        `phase`: what the progress line calls it ("evaluation before training", ...)."""
        n, k = len(self.prompts), len(self.clients)
        shares = [list(range(n))[i * n // k:(i + 1) * n // k] for i in range(k)]
        self._progress = PhaseProgress(phase, n, "prompts", stream=None,
                                       path=phase_file(self.run_dir, "eval"), every=2.0)
        try:
            with ThreadPoolExecutor(max_workers=k) as pool:
                results = list(pool.map(lambda i: self._generate_any(i, shares[i], version), range(k)))
        finally:
            self._progress.finish()
            self._progress = None
        rewards: list[float] = []
        failed = 0
        rows_out: list[str] = []
        for rows, gens in zip(shares, results, strict=True):
            for i, gen in zip(rows, gens, strict=True):
                completion = ""
                try:
                    completion, reward = self._score(i, gen)
                    rewards.append(reward)
                except Exception as exc:  # noqa: BLE001 - a user reward that raises scores 0 and is counted
                    failed += 1
                    rewards.append(0.0)
                    if failed <= 3:
                        log.warning("eval prompt %d: %s (scored 0)", self.prompts[i].index, exc)
                rows_out.append(json.dumps(prediction_row(self.prompts[i], completion, rewards[-1], gen)))
        write_text_atomic(self.run_dir / PREDICTIONS_DIR / f"step_{step}.jsonl", "".join(r + "\n" for r in rows_out))
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        passed = sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0
        log.info("eval at version %d: reward_mean %.4f, pass_rate %.4f over %d prompts (%d reward failures)",
                 version, mean, passed, n, failed)
        return {"eval/reward_mean": mean, "eval/pass_rate": passed, "eval/prompts": float(n),
                "eval/version": float(version), "eval/reward_failures": float(failed)}

    def _score(self, row: int, gen: rollout_pb2.Generation) -> tuple[str, float]:
        prompt, prompt_ids = self.prompts[row], self.encoded[row]
        output = unpack_i32(gen.output_ids).tolist()
        logprobs = unpack_f32(gen.logprobs).tolist() if gen.logprobs else [0.0] * len(output)
        sample = Sample(group_id=f"eval-{prompt.index}", index=0, group_size=1, prompt_ids=prompt_ids,
                        response_ids=output, rollout_logprobs=logprobs,
                        status=Status.COMPLETED if gen.finish_reason == "stop" else Status.TRUNCATED,
                        weight_version=gen.weight_version, prompt_index=prompt.index, metadata={"eval": "1"})
        completion = self.tokenizer.decode(output, skip_special_tokens=True)
        reward, _parts = self.scorer.score(prompt, completion, sample)
        return completion, reward

    def close(self) -> None:
        for c in self.clients:
            c.close()
