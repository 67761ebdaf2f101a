"""What the OpenAI endpoint costs over calling the engine directly: the same two-turn calculator episodes, run
N at a time, (a) through the real `openai` client over loopback HTTP with sessions (TITO recording included), and
(b) through `engine.submit` with a TitoSession in-process (the old agent).

    python bench/openai_endpoint.py [--episodes 64] [--concurrency 8] [--threads 1]

Prints episodes/s and mean ms per model turn for each, and the ratio. Uses the calculator example's warm-started
~0.1M-parameter model, so the engine's own time is small and the HTTP + JSON overhead shows at its largest.

Measured 2026-12-01 on the shared 2-core machine (load ~1.8; indicative only), 1 torch thread:
  1 at a time (32 episodes):  direct 57.3 episodes/s, 8.7 ms a turn | HTTP 43.3 episodes/s, 11.5 ms a turn (+2.8 ms)
  8 at a time (64 episodes):  direct 215 episodes/s | HTTP 70 episodes/s (x0.33: client, JSON and server threads
  share the two cores and the GIL with the engine). Before TCP_NODELAY on the server (headers and body are two
  writes, so each answer waited out a delayed ACK): 46 episodes/s. On a real model the engine's time per turn is
  tens to hundreds of ms, and these few ms are noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOOL = {"role": "tool", "content": "<result>2146</result>"}


def _direct(engine: Any, tok: Any, sampling: Any, seed: int) -> int:
    from rlfleet.services.rollout.tito import TitoSession

    session = TitoSession(tok, [{"role": "user", "content": "37*58"}])
    for turn in range(2):
        gen = engine.submit(session.input_ids, dataclasses.replace(sampling, seed=seed + turn)).result()
        session.add_generation(gen)
        if turn == 0:
            session.add_messages([TOOL])
    return session.model_turns


def _http(client: Any, store: Any, seed: int) -> int:
    sid = f"bench/{seed}"
    messages: list[Any] = [{"role": "user", "content": "37*58"}]
    for turn in range(2):
        reply = client.chat.completions.create(model="calc", messages=messages, max_tokens=12, seed=seed + turn,
                                               stop=["</calc>"], logprobs=True, extra_headers={"X-Session-Id": sid})
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, TOOL]
    return int(store.take(sid).model_turns)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import openai
    import torch
    from transformers import AutoTokenizer

    from rlfleet.protocols import SamplingParams
    from rlfleet.services.rollout.engines.torch_engine import TorchEngine
    from rlfleet.services.rollout.openai_api.app import AppSettings, OpenAIApp
    from rlfleet.services.rollout.openai_api.serve import model_context
    from rlfleet.services.rollout.openai_api.server import OpenAIServer
    from rlfleet.services.rollout.openai_api.sessions import SessionStore
    from tests.support.calculator_model import calculator_model_dir

    torch.set_num_threads(args.threads)
    model = calculator_model_dir()
    tok = AutoTokenizer.from_pretrained(str(model))
    engine = TorchEngine(model, max_batch_size=64, seed=0)
    stop = tok.convert_tokens_to_ids("</calc>")
    sampling = SamplingParams(max_new_tokens=12, stop_token_ids=(stop,))
    store = SessionStore(tok)
    server = OpenAIServer(OpenAIApp(engine, tok, SamplingParams(max_new_tokens=12), store,
                                    AppSettings(max_context=model_context(model))), api_key="bench").start()
    results = {}
    try:
        with openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0) as client:
            runs = {"direct (engine.submit + TitoSession)": lambda s: _direct(engine, tok, sampling, s),
                    "openai client over HTTP (sessions)": lambda s: _http(client, store, s)}
            for name, episode in runs.items():
                episode(10_000)                                               # warm up
                start = time.perf_counter()
                with ThreadPoolExecutor(args.concurrency) as pool:
                    turns = sum(pool.map(episode, range(args.episodes)))
                wall = time.perf_counter() - start
                results[name] = (args.episodes / wall, 1000 * wall * args.concurrency / turns)
                print(f"{name:40s} {results[name][0]:7.1f} episodes/s  {results[name][1]:6.1f} ms per turn")
    finally:
        server.stop()
        engine.shutdown()
    (direct, _), (http, _) = results.values()
    print(f"HTTP / direct episodes per second: {http / direct:.2f}")


if __name__ == "__main__":
    main()
