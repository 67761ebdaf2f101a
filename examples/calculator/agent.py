"""A rollout-function plugin: your own agent loop, written against the real `openai` client.

Name it in the config as `rollout.rollout_fn: examples.calculator.agent:calculator_agent` (with
`rollout.openai.enabled: true`). The rollout service calls it once per group ticket; it yields the group's samples as
each episode finishes. Each episode:

    user question -> model turn (stops at </calc>) -> tool answers <result>N</result> -> model's final answer

The agent only speaks the OpenAI chat API to its replica's endpoint; every request carries the episode's session id,
and the replica records the session as TITO tokens: the engine's output ids unchanged (loss mask 1, with their
logprobs) and the chat template's rendering of the tool message appended as new suffix tokens (loss mask 0). At the
end the session becomes the sample, so the trainer sees exactly what the engine saw and produced. Copy this file to
write your own environment: change `step_environment` (or call an agent framework with `base_url` and the headers).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import openai

from examples.calculator.tool import find_call, tool_message
from rlfleet.protocols import GroupTicket, Prompt, RolloutContext
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.messages import sample_seed
from rlfleet.services.rollout.openai_api.endpoint import OpenAIEndpoint, endpoint_of

log = logging.getLogger(__name__)
MAX_TURNS = 3
CALL_END = "</calc>"     # one token of the example's tokenizer: generation stops there


def step_environment(text: str) -> list[dict[str, str]] | None:
    """The environment's answer to one model turn: the tool's message, or None when the episode is over."""
    call = find_call(text)
    return [tool_message(call)] if call is not None else None


def run_episode(client: openai.OpenAI, session_headers: dict[str, str], ctx: RolloutContext, prompt: Prompt,
                seed: int) -> None:
    """The agent loop, in plain OpenAI calls. The endpoint keeps the session's turns; nothing is returned."""
    messages: list[Any] = list(prompt.messages or ({"role": "user", "content": prompt.text or ""},))
    for turn in range(MAX_TURNS):
        try:
            reply = client.chat.completions.create(
                model="policy", messages=messages, temperature=ctx.sampling.temperature, top_p=ctx.sampling.top_p,
                max_tokens=ctx.sampling.max_new_tokens, seed=(seed + turn) % 2**63, stop=[CALL_END], logprobs=True,
                extra_headers=session_headers)
        except openai.BadRequestError as exc:
            if exc.code == "context_length_exceeded" and turn > 0:
                break                                # the conversation fills the model's context: episode over
            raise
        choice = reply.choices[0]
        text = choice.message.content or ""
        messages.append({"role": "assistant", "content": text})
        if choice.finish_reason != "stop":           # the token budget (or the model's context) ran out
            break
        env = step_environment(text)
        if env is None:
            break
        messages += env


def episode(client: openai.OpenAI, endpoint: OpenAIEndpoint, ctx: RolloutContext, prompt: Prompt,
            ticket: GroupTicket, index: int) -> Sample:
    """One multi-turn episode -> one Sample (prompt ids, concatenated response, loss mask), scored."""
    session_id = endpoint.session_id(ticket, index)
    try:
        run_episode(client, endpoint.headers(session_id), ctx, prompt,
                    sample_seed(getattr(ctx, "run_seed", 0), ticket.group_id, index))
    except Exception:
        endpoint.store.discard(session_id)
        raise
    return ctx.score(prompt, endpoint.take(session_id).to_sample(ticket, index, ctx.replica_id))


def calculator_agent(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
    """group_size episodes of one question, run concurrently (the engine batches their turns)."""
    endpoint = endpoint_of(ctx)
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    with client, ThreadPoolExecutor(max_workers=ticket.group_size,
                                    thread_name_prefix=f"{ticket.group_id}-ep") as pool:
        futures = {pool.submit(episode, client, endpoint, ctx, prompt, ticket, i): i for i in range(ticket.group_size)}
        for future in as_completed(futures):
            index = futures[future]
            try:
                yield future.result()
            except Exception as exc:  # noqa: BLE001 - a failed episode fails its sample, not the group
                log.warning("episode %s/%d failed: %s: %s", ticket.group_id, index, type(exc).__name__, exc)
                yield Sample(group_id=ticket.group_id, index=index, group_size=ticket.group_size, prompt_ids=[],
                             response_ids=[], rollout_logprobs=[], status=Status.FAILED,
                             status_reason=f"episode raised {type(exc).__name__}: {exc}",
                             prompt_index=ticket.prompt_index, replica_id=ctx.replica_id)
