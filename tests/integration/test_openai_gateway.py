"""The run's OpenAI gateway routes every request of a session to one replica (services/rollout/router.py), relays
JSON and SSE answers, checks the key, and moves a dead replica's sessions to a live one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers import AutoTokenizer

from rlfleet.protocols import SamplingParams
from services.rollout.engines.torch_engine import TorchEngine
from services.rollout.openai_api.app import OpenAIApp
from services.rollout.openai_api.gateway import OpenAIGateway, Routes, replicas_in
from services.rollout.openai_api.server import REPLICA_HEADER, SESSION_HEADER, OpenAIServer
from services.rollout.openai_api.sessions import SessionStore
from services.rollout.router import ReplicaRouter
from tests.support.calculator_model import calculator_model_dir

torch.set_num_threads(1)
KEY = "gateway-key"
SESSIONS = [f"episode-{i}" for i in range(8)]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[OpenAIGateway, dict[str, OpenAIServer], dict[str, SessionStore]]]:
    model = calculator_model_dir()
    tok = AutoTokenizer.from_pretrained(str(model))
    engine = TorchEngine(model, max_batch_size=8, seed=0)         # one engine behind both endpoints: cheap
    servers, stores = {}, {}
    folder = tmp_path / "openai"
    folder.mkdir()
    for i in range(2):
        name = f"rollout-{i}"
        stores[name] = SessionStore(tok)
        servers[name] = OpenAIServer(OpenAIApp(engine, tok, SamplingParams(max_new_tokens=4), stores[name]),
                                     api_key=KEY, replica_id=name).start()
        (folder / f"{name}.json").write_text(json.dumps({"replica_id": name, "base_url": servers[name].base_url,
                                                         "rollout": f"grpc-{name}:1"}))
    (folder / "half-written.json").write_text("{")                  # ignored until it is whole

    def router(endpoints: list[str], credential: Any) -> ReplicaRouter:
        return ReplicaRouter(endpoints, credential, health=lambda e: True)     # health: the relay's own failures

    gateway = OpenAIGateway(Routes(lambda: replicas_in(folder), None, router), api_key=KEY).start()
    yield gateway, servers, stores
    gateway.stop()
    for s in servers.values():
        s.stop()
    engine.shutdown()


def _turn(client: openai.OpenAI, session: str, messages: list[Any]) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="calc", messages=messages, max_tokens=3, seed=1, extra_headers={SESSION_HEADER: session})
    return raw.headers[REPLICA_HEADER], raw.parse().choices[0].message.content or ""


def test_sessions_stick_to_one_replica_and_move_when_it_dies(fleet: Any) -> None:
    gateway, servers, stores = fleet
    placed: dict[str, str] = {}
    with openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as client:
        for session in SESSIONS:
            messages: list[Any] = [{"role": "user", "content": "12+30"}]
            where = set()
            for _ in range(2):
                replica, text = _turn(client, session, messages)
                where.add(replica)
                messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": "<result>42</result>"}]
            assert len(where) == 1                              # both turns of the session on one replica
            placed[session] = where.pop()
        assert set(placed.values()) == set(servers)             # sessions spread over the replicas
        for session, replica in placed.items():
            record = stores[replica].record(session)
            assert record is not None and record["turns"] == 2
            other = next(r for r in stores if r != replica)
            assert stores[other].record(session) is None

        stream = list(client.chat.completions.create(model="calc", messages=[{"role": "user", "content": "1+1"}],
                                                     max_tokens=3, stream=True, extra_headers={SESSION_HEADER: "s"}))
        assert stream[-1].choices[0].finish_reason in ("stop", "length")

        servers["rollout-0"].stop()                             # a replica dies: its sessions move
        moved = [s for s, r in placed.items() if r == "rollout-0"]
        replica, _ = _turn(client, moved[0], [{"role": "user", "content": "5+5"}])
        assert replica == "rollout-1"                           # (it starts over there: its tokens died with 0)
        assert stores["rollout-1"].record(moved[0])["turns"] == 1

    with openai.OpenAI(base_url=gateway.base_url, api_key="wrong", max_retries=0) as bad, \
            pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="calc", messages=[{"role": "user", "content": "1+1"}])
