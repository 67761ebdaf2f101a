"""A rollout-function plugin: your own agent loop, written with a TITO session.

Name it in the config as `rollout.rollout_fn: examples.calculator.agent:calculator_agent`. The rollout service calls
it once per group ticket; it yields the group's samples as each episode finishes. Each episode:

    user question -> model turn (stops at </calc>) -> tool answers <result>N</result> -> model's final answer

The TitoSession holds the exact token ids: the engine's output ids unchanged (loss mask 1) and the template's
rendering of the tool message appended as new suffix tokens (loss mask 0), so the trainer sees exactly what the engine
saw and produced. Copy this file to write your own environment: change `step_environment`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from examples.calculator.tool import find_call, tool_message
from rlfleet.protocols import GroupTicket, Prompt, RolloutContext
from rlfleet.sample import Sample, Status
from services.rollout.messages import sample_seed
from services.rollout.tito import TitoError, TitoSession

MAX_TURNS = 3
MAX_TOKENS = 60          # prompt + response; the example model has 64 positions


def step_environment(text: str) -> list[dict[str, str]] | None:
    """The environment's answer to one model turn: the tool's message, or None when the episode is over."""
    call = find_call(text)
    return [tool_message(call)] if call is not None else None


def episode(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket, index: int) -> Sample:
    """One multi-turn episode -> one Sample (prompt ids, concatenated response, loss mask), scored."""
    session = TitoSession(ctx.tokenizer, prompt.messages or ({"role": "user", "content": prompt.text or ""},))
    close_call = ctx.tokenizer.convert_tokens_to_ids("</calc>")
    base_seed = sample_seed(getattr(ctx, "run_seed", 0), ticket.group_id, index)
    for turn in range(MAX_TURNS):
        budget = MAX_TOKENS - session.num_tokens
        if budget < 1:
            break
        sampling = dataclasses.replace(ctx.sampling, seed=(base_seed + turn) % 2**63,
                                       stop_token_ids=(close_call,),
                                       max_new_tokens=min(ctx.sampling.max_new_tokens, budget))
        gen = ctx.generate(session.input_ids, sampling).result()
        text = session.add_generation(gen)
        if gen.finish_reason != "stop":
            break
        reply = step_environment(text)
        if reply is None:
            break
        try:
            session.add_messages(reply)
        except TitoError:
            break                                    # (cannot happen with this template; shown for your own)
    sample = session.to_sample(ticket, index, ctx.replica_id)
    return ctx.score(prompt, sample)


def calculator_agent(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
    """group_size episodes of one question, run concurrently (the engine batches their turns)."""
    with ThreadPoolExecutor(max_workers=ticket.group_size, thread_name_prefix=f"{ticket.group_id}-ep") as pool:
        futures = {pool.submit(episode, ctx, prompt, ticket, i): i for i in range(ticket.group_size)}
        for future in as_completed(futures):
            index = futures[future]
            try:
                yield future.result()
            except Exception as exc:  # noqa: BLE001 - a failed episode fails its sample, not the group
                yield Sample(group_id=ticket.group_id, index=index, group_size=ticket.group_size, prompt_ids=[],
                             response_ids=[], rollout_logprobs=[], status=Status.FAILED,
                             status_reason=f"episode raised {type(exc).__name__}: {exc}",
                             prompt_index=ticket.prompt_index, replica_id=ctx.replica_id)
