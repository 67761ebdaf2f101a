"""The OpenAI-compatible endpoint of a rollout replica, driven by the real `openai` client over loopback HTTP: a
multi-turn session becomes a TITO sample whose ids are the engine's, and that sample trains."""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from openai.types.chat import ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from pydantic import BaseModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfleet.config import TrainerConfig
from rlfleet.protocols import GroupTicket, SamplingParams
from rlfleet.sample import Sample
from rlfleet.services.rollout.context import GroupContext
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.openai_api.app import AppSettings, OpenAIApp
from rlfleet.services.rollout.openai_api.endpoint import OpenAIEndpoint
from rlfleet.services.rollout.openai_api.serve import model_context
from rlfleet.services.rollout.openai_api.server import SESSION_HEADER, OpenAIServer
from rlfleet.services.rollout.openai_api.sessions import ConflictError, SessionStore
from rlfleet.services.rollout.partial import RetractingEngine
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs
from rlfleet.services.trainer.step import StepContext, train_step
from tests.support.calculator_model import calculator_model_dir

torch.set_num_threads(1)
KEY = "test-openai-key"
QUESTION = "37*58"


@pytest.fixture(scope="module")
def calculator_model() -> Path:
    return calculator_model_dir()


def _extra(model: BaseModel) -> dict[str, Any]:
    """The fields the OpenAI types do not declare (our token ids)."""
    assert model.model_extra is not None
    return model.model_extra


def _lp_content(logprobs: ChoiceLogprobs | ChunkLogprobs | None) -> list[ChatCompletionTokenLogprob]:
    assert logprobs is not None and logprobs.content is not None
    return logprobs.content


@pytest.fixture(scope="module")
def live(calculator_model: Path) -> Iterator[tuple[OpenAIServer, SessionStore, TorchEngine, Any]]:
    tok = AutoTokenizer.from_pretrained(str(calculator_model))
    engine = TorchEngine(calculator_model, max_batch_size=8, seed=0)
    store = SessionStore(tok, max_sessions=16)
    app = OpenAIApp(engine, tok, SamplingParams(max_new_tokens=12), store,
                    AppSettings(model_name="calc", max_context=model_context(calculator_model)))
    server = OpenAIServer(app, "127.0.0.1", 0, api_key=KEY, replica_id="rollout-0").start()
    yield server, store, engine, tok
    server.stop()
    engine.shutdown()


def _client(server: OpenAIServer, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)


def _session(client: openai.OpenAI, session_id: str, seed: int) -> list[Any]:
    """Two model turns with a tool message between them (whatever the model wrote); returns the replies."""
    headers = {SESSION_HEADER: session_id}
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    replies = []
    for turn in range(2):
        reply = client.chat.completions.create(model="calc", messages=messages, temperature=1.0, max_tokens=8,
                                               seed=seed + turn, stop=["</calc>"], logprobs=True,
                                               extra_headers=headers)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "tool", "content": "<result>2146</result>"})
    return replies


def test_multi_turn_session_is_the_engines_tokens_and_trains(live: Any, calculator_model: Path,
                                                             gloo_world: None) -> None:
    server, store, engine, tok = live
    ticket = GroupTicket(group_id="g0", prompt_index=0, group_size=2)
    samples: list[Sample] = []
    with _client(server) as client:
        for index in range(2):
            sid = f"g0/{index}"
            replies = _session(client, sid, seed=100 + 10 * index)
            session = store.take(sid)
            assert session is not None and session.model_turns == 2
            sample = session.to_sample(ticket, index, "rollout-0")

            # the prompt is the chat template's rendering of the opening message
            opening = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                              add_generation_prompt=True)
            assert sample.prompt_ids == tok.encode(opening, add_special_tokens=False)
            first, second = (r.choices[0] for r in replies)
            ids1, ids2 = first.model_extra["token_ids"], second.model_extra["token_ids"]
            # turn 2's prompt is exactly what the session held: prompt + turn-1 ids + the tool message's suffix
            prompt2 = replies[1].model_extra["prompt_token_ids"]
            assert prompt2[:len(sample.prompt_ids) + len(ids1)] == sample.prompt_ids + ids1
            suffix = prompt2[len(sample.prompt_ids) + len(ids1):]
            assert tok.decode(suffix, skip_special_tokens=False).endswith("<|tool|><result>2146</result><|end|>"
                                                                         "<|assistant|>")
            assert sample.response_ids == ids1 + suffix + ids2
            assert sample.loss_mask == [1] * len(ids1) + [0] * len(suffix) + [1] * len(ids2)
            logprobs = [c.logprob for c in first.logprobs.content] + [0.0] * len(suffix) + \
                [c.logprob for c in second.logprobs.content]
            assert sample.rollout_logprobs == logprobs
            assert first.message.content == tok.decode(ids1, skip_special_tokens=True)

            # the ids are what the engine generates for that input and seed (asked directly, without HTTP)
            for reply, seed in zip(replies, (100 + 10 * index, 101 + 10 * index), strict=True):
                choice = reply.choices[0]
                direct = engine.submit(reply.model_extra["prompt_token_ids"], SamplingParams(
                    temperature=1.0, max_new_tokens=8, stop_token_ids=(tok.convert_tokens_to_ids("</calc>"),),
                    seed=seed)).result(timeout=60)
                assert list(direct.output_ids) == choice.model_extra["token_ids"]
                assert list(direct.logprobs) == [c.logprob for c in choice.logprobs.content]
            sample.reward = float(index)
            samples.append(Sample.from_proto(sample.to_proto()))        # the buffer's wire format
    assert len(store) == 0

    # it trains: the trainer's logprobs of the response tokens are the engine's, and a GRPO step is finite
    model = AutoModelForCausalLM.from_pretrained(str(calculator_model), dtype=torch.float32)
    batch = build_train_batch(samples, pad_id=tok.pad_token_id)
    with torch.no_grad():
        trainer_lp = forward_logprobs(model, batch, temperature=1.0)                      # [S, T]
    mask = batch.response_mask.bool()
    assert mask.sum() > 0
    torch.testing.assert_close(trainer_lp[mask], batch.rollout_logprobs[mask], rtol=0, atol=2e-4)
    advantage_fn, loss_fn = resolve(TrainerConfig(algorithm="grpo"))
    ctx = StepContext(advantage_fn=advantage_fn, loss_fn=loss_fn, hooks=[], temperature=1.0, minibatches=1,
                      grad_clip=1.0, world_size=1, device=torch.device("cpu"), pad_id=tok.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def clip(max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))

    metrics = train_step(model, optimizer, clip, [samples], 0, ctx)
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert metrics["samples"] == 2 and metrics["tokens"] == float(mask.sum())


def test_streaming_chat_and_completions_with_logprobs(live: Any) -> None:
    server, store, _, tok = live
    with _client(server) as client:
        whole = client.chat.completions.create(model="calc", messages=[{"role": "user", "content": QUESTION}],
                                               max_tokens=6, seed=7, logprobs=True)
        chunks = list(client.chat.completions.create(
            model="calc", messages=[{"role": "user", "content": QUESTION}], max_tokens=6, seed=7, logprobs=True,
            stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        streamed_lp = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs
                       for e in _lp_content(c.choices[0].logprobs)]
        assert text == whole.choices[0].message.content
        assert streamed_lp == [e.logprob for e in _lp_content(whole.choices[0].logprobs)]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(streamed_lp)

        # raw completions, by text and by token ids, in a session: the second prompt extends the first
        headers = {SESSION_HEADER: "raw-1"}
        prompt = "<|user|>12+30<|end|><|assistant|>"
        one = client.completions.create(model="calc", prompt=prompt, max_tokens=5, seed=3, logprobs=1,
                                        extra_headers=headers)
        lp = one.choices[0].logprobs
        assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
        assert len(lp.tokens) == len(lp.token_logprobs) == len(_extra(one.choices[0])["token_ids"])
        assert all(x <= 0.0 for x in lp.token_logprobs)
        ids = _extra(one)["prompt_token_ids"] + _extra(one.choices[0])["token_ids"] + \
            tok.encode("<|user|>1", add_special_tokens=False)
        streamed = list(client.completions.create(model="calc", prompt=ids, max_tokens=4, seed=4, logprobs=0,
                                                  stream=True, extra_headers=headers))
        gen_ids = [t for c in streamed for t in _extra(c.choices[0]).get("token_ids", [])]
        session = store.take("raw-1")
        assert session is not None and session.model_turns == 2
        assert session.input_ids == ids + gen_ids
        assert session.loss_mask == [1] * len(_extra(one.choices[0])["token_ids"]) + [0, 0] + [1] * len(gen_ids)


def test_refusals(live: Any) -> None:
    server, store, _, _ = live
    with _client(server, key="wrong") as bad, pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="calc", messages=[{"role": "user", "content": "1+1"}])
    request = urllib.request.Request(server.base_url + "/chat/completions", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as no_key:
        urllib.request.urlopen(request, timeout=10)
    assert no_key.value.code == 401
    with urllib.request.urlopen(server.base_url.removesuffix("/v1") + "/health", timeout=10) as health:
        assert json.loads(health.read())["status"] == "ok"           # probes need no key
    with _client(server) as client:
        headers = {SESSION_HEADER: "s-rewrite"}
        client.chat.completions.create(model="calc", messages=[{"role": "user", "content": "1+1"}], max_tokens=2,
                                       extra_headers=headers)
        with pytest.raises(openai.BadRequestError, match="do not extend"):      # history rewritten: refused
            client.chat.completions.create(model="calc", max_tokens=2, extra_headers=headers, messages=[
                {"role": "user", "content": "1+1"}, {"role": "assistant", "content": "not what it said"},
                {"role": "user", "content": "again"}])
        with pytest.raises(openai.BadRequestError, match="single tokens"):
            client.chat.completions.create(model="calc", messages=[{"role": "user", "content": "1"}], stop=["12"])
        with pytest.raises(openai.BadRequestError, match="'n' must be 1"):
            client.chat.completions.create(model="calc", messages=[{"role": "user", "content": "1"}], n=2)
    assert store.take("s-rewrite") is not None
    assert store.take("never-opened") is None


def test_a_cancelled_group_aborts_its_sessions_completions(live: Any) -> None:
    """The buffer cancels a group (GroupContext.abort): its sessions' requests in flight end with 'abort'."""
    server, store, engine, _ = live
    app = server.app
    endpoint = OpenAIEndpoint(server.base_url, KEY, store, app.abort_sessions)
    ticket = GroupTicket(group_id="g9", prompt_index=0, group_size=1)
    sid = endpoint.session_id(ticket, 0)
    engine.pause()                                   # the request waits in the engine until the abort
    replies: list[Any] = []
    try:
        with _client(server) as client:
            worker = threading.Thread(target=lambda: replies.append(client.chat.completions.create(
                model="calc", messages=[{"role": "user", "content": QUESTION}], max_tokens=8,
                extra_headers=endpoint.headers(sid))))
            worker.start()
            deadline = time.monotonic() + 60
            while engine.stats().waiting == 0:
                assert time.monotonic() < deadline and worker.is_alive(), "the request did not reach the engine"
                time.sleep(0.01)
            holder = type("Ctx", (), {"openai": endpoint})()
            assert GroupContext(holder, engine, "g1").abort() == 0                    # another group: untouched
            assert GroupContext(holder, engine, "g9").abort() == 1
            worker.join(timeout=60)
    finally:
        engine.resume()
    assert replies[0].choices[0].finish_reason == "abort"
    assert endpoint.take(sid).finish_reason == "abort"


def test_streaming_engine_callbacks_and_the_fallback_give_the_same_chunks(live: Any) -> None:
    server, store, engine, tok = live
    seen: list[tuple[int, float]] = []
    gen = engine.submit_streaming([1, 3, 14, 15, 1, 4], SamplingParams(max_new_tokens=6, seed=5),
                                  lambda t, lp: seen.append((t, lp))).result(timeout=60)
    assert seen == list(zip(gen.output_ids, gen.logprobs, strict=True))      # every token, as chosen, in order

    request: dict[str, Any] = {"model": "calc", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 6,
                               "seed": 9,
               "logprobs": True, "stream": True}
    fallback = OpenAIServer(OpenAIApp(RetractingEngine(engine), tok, SamplingParams(max_new_tokens=6),
                                      SessionStore(tok)), api_key=KEY).start()     # retract mode: no token stream
    try:
        answers = []
        for srv in (server, fallback):
            with _client(srv) as client:
                chunks = list(client.chat.completions.create(**request))
            answers.append([(c.choices[0].delta.content, c.choices[0].model_extra.get("token_ids"))
                            for c in chunks if c.choices])
        assert answers[0] == answers[1]
    finally:
        fallback.stop()


def test_a_reader_that_leaves_mid_stream_still_records_the_turn(live: Any) -> None:
    server, store, _, _ = live
    body = json.dumps({"model": "calc", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8,
                       "stream": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=body, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json", SESSION_HEADER: "leaver"})
    response = conn.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")
    conn.close()                                              # gone after the first chunk
    deadline = time.monotonic() + 60
    while True:
        try:
            record = store.record("leaver")
            break
        except ConflictError:                                 # its completion is still being finished
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert record is not None and record["turns"] == 1 and sum(record["loss_mask"]) >= 1
    assert store.take("leaver") is not None
