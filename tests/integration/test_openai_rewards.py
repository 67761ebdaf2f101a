"""External agents' sessions become training samples: over loopback HTTP with the real `openai` client, a finished
session's reward is posted to `/v1/sessions/<id>/reward` (only under the key that opened it), and the stock rollout
function `external_sessions` turns a group of rewarded sessions into samples holding exactly the engine's tokens and
the posted rewards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import AutoTokenizer

from rlfleet.protocols import GroupTicket, Prompt, SamplingParams
from rlfleet.sample import Status
from rlfleet.services.rollout.context import GroupAborted, GroupContext
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.external_sessions import external_sessions
from rlfleet.services.rollout.openai_api.app import OpenAIApp
from rlfleet.services.rollout.openai_api.endpoint import OpenAIEndpoint
from rlfleet.services.rollout.openai_api.server import SESSION_HEADER, OpenAIServer
from rlfleet.services.rollout.openai_api.sessions import SessionStore
from tests.support.calculator_model import calculator_model_dir

torch.set_num_threads(1)
KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"


class ReplicaContext:
    """What a replica's context declares to a rollout function that needs the endpoint (ServesOpenAI)."""

    def __init__(self, endpoint: OpenAIEndpoint) -> None:
        self._endpoint, self.replica_id = endpoint, "rollout-0"

    @property
    def openai(self) -> OpenAIEndpoint | None:
        return self._endpoint


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[OpenAIServer, OpenAIApp, TorchEngine]]:
    model = calculator_model_dir()
    tok = AutoTokenizer.from_pretrained(str(model))
    engine = TorchEngine(model, max_batch_size=4, seed=0)
    app = OpenAIApp(engine, tok, SamplingParams(max_new_tokens=4), SessionStore(tok))
    server = OpenAIServer(app, "127.0.0.1", 0, api_key=[KEY_A, KEY_B], replica_id="rollout-0").start()
    yield server, app, engine
    server.stop()
    engine.shutdown()


def _two_turns(client: openai.OpenAI, sid: str) -> str:
    """Two raw-completion turns in one session (the second extends the held text); returns the full text."""
    text = "37*58="
    for extra in ("", "<result>2146</result>"):
        text += extra
        reply = client.completions.create(model="calc", prompt=text, max_tokens=4, temperature=1.0,
                                          extra_headers={SESSION_HEADER: sid})
        text += reply.choices[0].text
    return text


def _post(client: openai.OpenAI, sid: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"/sessions/{sid}/reward", body=body, cast_to=httpx.Response)
    return dict(response.json())


def test_rewarded_sessions_become_a_group_of_samples(live: Any) -> None:
    server, app, _engine = live
    a = openai.OpenAI(base_url=server.base_url, api_key=KEY_A, max_retries=0)
    b = openai.OpenAI(base_url=server.base_url, api_key=KEY_B, max_retries=0)
    sids = ["agent/one", "agent/two", "agent/three"]
    for sid in sids:
        _two_turns(a, sid)
    records = {sid: a.get(f"/sessions/{sid}", cast_to=httpx.Response).json() for sid in sids}

    # another key may not reward (or even see) a's session; the session stays
    with pytest.raises(openai.NotFoundError):
        _post(b, sids[0], {"reward": 1.0})
    # a bad body is refused and loses nothing
    for body in ({"reward": "high"}, {"reward": None}, {"reward": True}, {"reward": 1.0, "bonus": 2},
                 {"reward": 1.0, "group": ""}):
        with pytest.raises(openai.BadRequestError):
            _post(a, sids[0], body)
    with pytest.raises(openai.NotFoundError):
        _post(a, "agent/never-opened", {"reward": 1.0})

    assert _post(a, sids[0], {"reward": 1.0, "group": "task-1"})["waiting"] == 1
    assert _post(a, sids[1], {"reward": 0.25})["waiting"] == 2                     # no key: arrival order
    assert _post(a, sids[2], {"reward": 0.0, "group": "task-1"})["waiting"] == 3
    with pytest.raises(openai.NotFoundError):                                       # rewarded once: gone
        _post(a, sids[0], {"reward": 1.0})

    endpoint = OpenAIEndpoint(server.base_url, KEY_A, app.store, app.abort_sessions, app.rewarded)
    ctx = GroupContext(ReplicaContext(endpoint), _engine, "g-1")
    ticket = GroupTicket(group_id="g-1", prompt_index=7, group_size=2)
    samples = list(external_sessions(ctx, Prompt(index=7, text="unused"), ticket))
    # the two sessions of key task-1 form the group, in the order their rewards came; the unkeyed one waits
    assert [s.metadata["external_session"] for s in samples] == [sids[0], sids[2]]
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert [s.index for s in samples] == [0, 1] and {s.group_id for s in samples} == {"g-1"}
    for s, sid in zip(samples, [sids[0], sids[2]], strict=True):
        rec = records[sid]
        assert s.prompt_ids == rec["prompt_ids"] and s.response_ids == rec["response_ids"]
        assert s.loss_mask == rec["loss_mask"] and s.rollout_logprobs == pytest.approx(rec["logprobs"])
        assert 0 in s.loss_mask and 1 in s.loss_mask            # the environment's text is masked out
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.metadata["turns"] == "2"
    assert len(app.rewarded) == 1

    # a group that waits for sessions stops when the work loop aborts it
    ctx2 = GroupContext(ReplicaContext(endpoint), _engine, "g-2")
    ctx2.abort()
    with pytest.raises(GroupAborted):
        list(external_sessions(ctx2, Prompt(index=8, text="unused"), GroupTicket("g-2", 8, 4)))
