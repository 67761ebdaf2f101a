"""An agent that runs outside `rlfleet run`, written against the real `openai` client: its episodes train the run.

    rlfleet run examples/external_agent/config.yaml          # terminal 1: prints the endpoint's URL and key file
    python -m examples.external_agent.agent runs/external_agent   # terminal 2: this agent

Each episode is a two-turn conversation on the run's OpenAI endpoint (raw completions: the example's model has no
chat template): the agent asks "a+b=", the model answers, the environment asks a second sum in the same context,
the model answers again. Every request carries the episode's session id (`X-Session-Id`); the replica records the
exact token ids. When the episode ends the agent posts its reward to `/v1/sessions/<id>/reward` with a group key
(the task's), and the run's rollout function `external_sessions` turns rollout.group_size sessions of one key into a
GRPO group. Nothing of the run is imported: the agent needs the endpoint's URL, its key, and `openai`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

SESSION_HEADER = "X-Session-Id"


def exact(answers: list[str], sums: list[int]) -> float:
    """Half a point per answer that is the sum exactly."""
    return sum(0.5 for a, s in zip(answers, sums, strict=True) if a.strip() == str(s))


def odd_first_digit(answers: list[str], sums: list[int]) -> float:
    """The share of answers that start with an odd digit: a toy signal a few steps learn (the tests use it)."""
    return sum(1.0 for a in answers if a.strip()[:1] in tuple("13579")) / max(len(answers), 1)


def even_first_digit(answers: list[str], sums: list[int]) -> float:
    """The share of answers that start with an even digit (the addition model's answers mostly start odd: room to
    learn)."""
    return sum(1.0 for a in answers if a.strip()[:1] in tuple("02468")) / max(len(answers), 1)


REWARDS: dict[str, Callable[[list[str], list[int]], float]] = {"exact": exact, "odd_first_digit": odd_first_digit,
                                                              "even_first_digit": even_first_digit}


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str

    @classmethod
    def of_run(cls, run_dir: Path, timeout: float = 300.0) -> Endpoint:
        """The gateway's URL (RUN_DIR/openai_gateway.json, written once it serves) and the key (RUN_DIR/pki/
        openai-api.key in the default security mode; the run token in mode token)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                base_url = json.loads((run_dir / "openai_gateway.json").read_text())["base_url"]
                break
            except (OSError, ValueError, KeyError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no OpenAI endpoint in {run_dir} after {timeout:.0f}s") from None
                time.sleep(0.2)
        for key_file in (run_dir / "pki" / "openai-api.key", run_dir / "run.token"):
            if key_file.is_file():
                return cls(base_url, key_file.read_text().splitlines()[0].strip())
        return cls(base_url, "none")


def episode(client: openai.OpenAI, rng: random.Random, task: tuple[int, int], reward_fn: Callable[..., float],
            group: str, max_tokens: int = 4, turns: int = 2) -> float:
    """`turns` questions in one session (the task's, then random ones in the same context), then the reward posted.
    Returns the reward."""
    session = {SESSION_HEADER: f"agent/{uuid.uuid4().hex}"}
    a, b = task
    c, d = rng.randrange(100), rng.randrange(100)
    text, answers = f"{a}+{b}=", []
    for question in ("", f" {c}+{d}=")[:turns]:
        text += question                                  # the environment's turn: appended to the held text
        reply = client.completions.create(model="policy", prompt=text, max_tokens=max_tokens, temperature=1.0,
                                          extra_headers=session)
        answer = reply.choices[0].text
        answers.append(answer.split("</s>")[0])
        text += answer                                    # exactly as returned: the session holds these tokens
    reward = reward_fn(answers, [a + b, c + d][:turns])
    client.post(f"/sessions/{session[SESSION_HEADER]}/reward", body={"reward": reward, "group": group},
                cast_to=httpx.Response)
    return reward


def run_agent(endpoint: Endpoint, group_size: int, stop: threading.Event, reward: str = "exact", seed: int = 0,
              workers: int = 4, tasks: int | None = None, turns: int = 2) -> list[float]:
    """Episodes until `stop` is set (or `tasks` tasks are done), `group_size` per task, `workers` at once. Returns
    the rewards posted, in order."""
    reward_fn = REWARDS[reward]
    rng = random.Random(seed)
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=2, timeout=120.0)
    posted: list[float] = []
    done = 0
    with client, ThreadPoolExecutor(max_workers=workers) as pool:
        while not stop.is_set() and (tasks is None or done < tasks):
            task = (rng.randrange(100), rng.randrange(100))
            group = f"task-{done}-{task[0]}+{task[1]}"
            seeds = [rng.randrange(2**31) for _ in range(group_size)]
            futures = [pool.submit(episode, client, random.Random(s), task, reward_fn, group, 4, turns)
                       for s in seeds]
            for f in futures:
                try:
                    posted.append(f.result())
                except (openai.APIError, httpx.HTTPError) as exc:
                    if stop.is_set():
                        break                             # the run ended under us
                    print(f"agent: episode failed: {exc}", file=sys.stderr)
            done += 1
    return posted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.external_agent.agent")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--group-size", type=int, default=8, help="episodes per task (the run's rollout.group_size)")
    parser.add_argument("--reward", choices=sorted(REWARDS), default="exact")
    parser.add_argument("--tasks", type=int, default=None, help="stop after this many tasks (default: until ^C)")
    parser.add_argument("--turns", type=int, choices=(1, 2), default=2,
                        help="questions per episode (1 on the toy addition model: see README.md)")
    ns = parser.parse_args(argv)
    endpoint = Endpoint.of_run(ns.run_dir)
    print(f"agent: episodes on {endpoint.base_url}", file=sys.stderr)
    stop = threading.Event()
    try:
        rewards = run_agent(endpoint, ns.group_size, stop, ns.reward, tasks=ns.tasks, turns=ns.turns)
    except KeyboardInterrupt:
        stop.set()
        return 130
    print(f"agent: {len(rewards)} episodes, mean reward {sum(rewards) / max(len(rewards), 1):.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
