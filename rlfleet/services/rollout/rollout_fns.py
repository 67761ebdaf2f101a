"""Built-in rollout functions (rollout.rollout_fn). Each yields a group's samples as they finish."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait

from rlfleet.protocols import Generation, GroupTicket, Prompt, RolloutContext
from rlfleet.sample import RoutedExperts, Sample, Status
from rlfleet.services.rollout.messages import sample_seed, status_of


def single_turn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
    """group_size completions of one prompt with the config sampling (a per-sample seed from the run seed).

    Whenever it wakes, it scores every completion that has finished by then in one call (`score_group`: one hand-off
    to the reward's thread for all of them, where per-sample scoring paid one each); a batched reward scores the
    whole group at the end."""
    prompt_ids = ctx.encode_prompt(prompt)
    futures = {f: i for i, f in enumerate(submit_group(ctx, prompt_ids, ticket))}
    held: list[Sample] = []                          # a batched reward scores the group at once, at the end
    batched = bool(getattr(ctx, "batched_reward", False))
    score_group = getattr(ctx, "score_group", None)
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        ready = [sample_of(ctx, prompt_ids, ticket, futures[f], f) for f in sorted(done, key=futures.__getitem__)]
        failed = [s for s in ready if s.status == Status.FAILED]
        scorable = [s for s in ready if s.status != Status.FAILED]
        yield from failed
        if batched:
            held += scorable
        elif score_group is not None:
            yield from score_group(prompt, scorable)
        else:
            yield from (ctx.score(prompt, s) for s in scorable)
    if held:
        yield from ctx.score_group(prompt, held)  # type: ignore[attr-defined]


def submit_group(ctx: RolloutContext, prompt_ids: list[int], ticket: GroupTicket) -> list[Future[Generation]]:
    """The group's group_size engine requests, sample i with the config sampling and its own seed from the run
    seed, the group id and i (a sample's draws never depend on what else the engine runs)."""
    run_seed = getattr(ctx, "run_seed", 0)
    return [ctx.generate(prompt_ids, dataclasses.replace(ctx.sampling, seed=sample_seed(run_seed, ticket.group_id, i)))
            for i in range(ticket.group_size)]


def sample_of(ctx: RolloutContext, prompt_ids: list[int], ticket: GroupTicket, index: int,
              future: Future[Generation]) -> Sample:
    """The sample of a finished generation request (FAILED when the engine raised for it)."""
    sample = Sample(group_id=ticket.group_id, index=index, group_size=ticket.group_size, prompt_ids=prompt_ids,
                    response_ids=[], rollout_logprobs=[], prompt_index=ticket.prompt_index, replica_id=ctx.replica_id)
    try:
        gen = future.result()
    except Exception as exc:  # noqa: BLE001 - an engine failure fails this sample only
        sample.status, sample.status_reason = Status.FAILED, f"engine raised {type(exc).__name__}: {exc}"
        return sample
    sample.response_ids, sample.rollout_logprobs = list(gen.output_ids), list(gen.logprobs)
    sample.weight_version, sample.status = gen.weight_version, status_of(gen.finish_reason)
    if sample.status == Status.ABORTED:
        sample.status_reason = f"engine finish_reason '{gen.finish_reason}'"
    versions = tuple(getattr(gen, "token_versions", ()) or ())
    if versions and len(set(versions)) > 1:          # the weights changed mid-sequence (in-place update)
        sample.token_versions = list(versions)
    if gen.routed_experts is not None:               # MoE: per-token expert ids for routing replay (R3)
        sample.routed_experts = RoutedExperts(ids=gen.routed_experts)
    return sample
