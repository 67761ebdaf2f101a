"""The run's OpenAI gateway routes every request of a session to one replica (rlfleet/services/rollout/router.py),
relays
JSON and SSE answers, checks the key, and moves a dead replica's sessions to a live one."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
import torch
import yaml
from transformers import AutoTokenizer

from rlfleet.protocols import SamplingParams
from rlfleet.security.pki import CA_CERT, cert_paths, create_run_pki
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.openai_api.app import OpenAIApp
from rlfleet.services.rollout.openai_api.gateway import OpenAIGateway, Routes, http_router, replicas_in
from rlfleet.services.rollout.openai_api.server import REPLICA_HEADER, SESSION_HEADER, OpenAIServer
from rlfleet.services.rollout.openai_api.sessions import SessionStore
from tests.support.calculator_model import calculator_model_dir

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
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

    gateway = OpenAIGateway(Routes(lambda: replicas_in(folder)), api_key=KEY).start()
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


def test_the_gateway_process_serves_the_run_with_its_key(fleet: Any, tmp_path: Path) -> None:
    """`python -m rlfleet.services.rollout.openai_api` (what `rlfleet run` starts): token mode, so the key is the run
    token."""
    _, servers, stores = fleet
    (tmp_path / "token").write_text(KEY)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "gw", "dir": str(tmp_path)}, "model": {"path": str(tmp_path / "model")},
        "rollout": {"reward_fn": "examples.calculator.reward:solved", "data_source": "examples.calculator.data:x",
                    "openai": {"enabled": True}},
        "security": {"mode": "token", "token_file": str(tmp_path / "token")}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.services.rollout.openai_api", "--config", str(config)],
                            cwd=ROOT,
                            env=env, stderr=subprocess.PIPE, text=True)
    address = tmp_path / "openai_gateway.json"
    try:
        deadline = time.monotonic() + 60
        while not address.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)
        base_url = json.loads(address.read_text())["base_url"]
        with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
            replica, _ = _turn(client, "via-process", [{"role": "user", "content": "2+2"}])
        assert stores[replica].record("via-process") is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not address.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_https_with_the_run_ca_end_to_end(tmp_path: Path) -> None:
    """mtls mode beyond loopback: the replica speaks HTTPS with its run-CA certificate; the gateway and clients
    verify it against RUN_DIR/pki/ca.crt; a client that does not trust the run CA cannot connect."""
    pki = create_run_pki(tmp_path / "pki", [("rollout", "rollout-0")])
    trust = ssl.create_default_context(cafile=str(pki / CA_CERT))
    model = calculator_model_dir()
    tok = AutoTokenizer.from_pretrained(str(model))
    engine = TorchEngine(model, max_batch_size=4, seed=0)
    store = SessionStore(tok)
    replica = OpenAIServer(OpenAIApp(engine, tok, SamplingParams(max_new_tokens=4), store), api_key=KEY,
                           replica_id="rollout-0", tls=cert_paths(pki, "rollout-0")).start()
    folder = tmp_path / "openai"
    folder.mkdir()
    (folder / "rollout-0.json").write_text(json.dumps({"base_url": replica.base_url, "rollout": "grpc-0:1"}))
    gateway = OpenAIGateway(Routes(lambda: replicas_in(folder), http_router(trust)), api_key=KEY, tls=trust).start()
    try:
        assert replica.base_url.startswith("https://127.0.0.1:")
        # openai types http_client as an httpx2.Client but takes an httpx.Client too (is_legacy_httpx_sync_client);
        # cast, not an ignore, so any openai version's typing passes
        with httpx.Client(verify=trust) as http, openai.OpenAI(base_url=replica.base_url, api_key=KEY,
                                                                http_client=cast(Any, http),
                                                                max_retries=0) as client:
            replica_id, text = _turn(client, "tls-1", [{"role": "user", "content": "3+4"}])
            assert replica_id == "rollout-0"
        with openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as client:
            _turn(client, "tls-1", [{"role": "user", "content": "3+4"}, {"role": "assistant", "content": text},
                                    {"role": "user", "content": "again"}])
        record = store.record("tls-1")
        assert record is not None and record["turns"] == 2                 # both turns, one session, over TLS
        with openai.OpenAI(base_url=replica.base_url, api_key=KEY, max_retries=0) as untrusting, \
                pytest.raises(openai.APIConnectionError):
            untrusting.models.list()                                     # the system CAs do not know the run CA
    finally:
        gateway.stop()
        replica.stop()
        engine.shutdown()
