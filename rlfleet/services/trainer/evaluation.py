"""Held-out evaluation: greedy generations from the rollout replicas, scored with the reward function."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlfleet.config import Config
from rlfleet.data.files import eval_source
from rlfleet.protocols import Prompt
from rlfleet.rewards.scorer import load_scorer
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

    def _generate(self, client: RolloutClient, rows: Sequence[int], version: int) -> list[rollout_pb2.Generation]:
        out: list[rollout_pb2.Generation] = []
        for lo in range(0, len(rows), self.batch_size):
            chunk = rows[lo:lo + self.batch_size]
            req = rollout_pb2.GenerateRequest(input_ids=[pack_i32(self.encoded[i]) for i in chunk],
                                              sampling=self.sampling, min_version=version, return_logprobs=True)
            patience = PATIENCE if client.address in self._answered else STARTUP_PATIENCE
            reply = client.generate(req, GENERATE_TIMEOUT, patience)
            self._answered.add(client.address)
            if len(reply.generations) != len(chunk):
                raise RuntimeError(f"Rollout.Generate at {client.address} returned {len(reply.generations)} "
                                   f"generations for {len(chunk)} prompts")
            out.extend(reply.generations)
        return out

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

    def run(self, version: int) -> dict[str, float]:
        n, k = len(self.prompts), len(self.clients)
        shares = [list(range(n))[i * n // k:(i + 1) * n // k] for i in range(k)]
        with ThreadPoolExecutor(max_workers=k) as pool:
            results = list(pool.map(lambda i: self._generate_any(i, shares[i], version), range(k)))
        rewards: list[float] = []
        failed = 0
        for rows, gens in zip(shares, results, strict=True):
            for i, gen in zip(rows, gens, strict=True):
                try:
                    rewards.append(self._score(i, gen))
                except Exception as exc:  # noqa: BLE001 - a user reward that raises scores 0 and is counted
                    failed += 1
                    rewards.append(0.0)
                    if failed <= 3:
                        log.warning("eval prompt %d: %s (scored 0)", self.prompts[i].index, exc)
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        passed = sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0
        log.info("eval at version %d: reward_mean %.4f, pass_rate %.4f over %d prompts (%d reward failures)",
                 version, mean, passed, n, failed)
        return {"eval/reward_mean": mean, "eval/pass_rate": passed, "eval/prompts": float(n),
                "eval/version": float(version), "eval/reward_failures": float(failed)}

    def _score(self, row: int, gen: rollout_pb2.Generation) -> float:
        prompt, prompt_ids = self.prompts[row], self.encoded[row]
        output = unpack_i32(gen.output_ids).tolist()
        logprobs = unpack_f32(gen.logprobs).tolist() if gen.logprobs else [0.0] * len(output)
        sample = Sample(group_id=f"eval-{prompt.index}", index=0, group_size=1, prompt_ids=prompt_ids,
                        response_ids=output, rollout_logprobs=logprobs,
                        status=Status.COMPLETED if gen.finish_reason == "stop" else Status.TRUNCATED,
                        weight_version=gen.weight_version, prompt_index=prompt.index, metadata={"eval": "1"})
        completion = self.tokenizer.decode(output, skip_special_tokens=True)
        reward, _parts = self.scorer.score(prompt, completion, sample)
        return reward

    def close(self) -> None:
        for c in self.clients:
            c.close()
