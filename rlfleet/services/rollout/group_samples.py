"""A single-turn group's engine requests and the samples they become: what `single_turn` and its collector
(single_turn_groups.py) both do, so the two make the same samples.

When the context wants reward baselines (rlfleet.protocols.WantsRewardBaselines: the trainer's estimator is ReMax's),
a group also submits one greedy (temperature 0) request for its prompt; its sample is scored with the group's and
its reward set on every sample of the group (`set_baseline`), and it is never put, so it is not trained on."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

from rlfleet.protocols import Generation, GroupTicket, RolloutContext, WantsRewardBaselines
from rlfleet.sample import RoutedExperts, Sample, Status
from rlfleet.services.rollout.messages import sample_seed, status_of


def submit_group(ctx: RolloutContext, prompt_ids: list[int], ticket: GroupTicket) -> list[Future[Generation]]:
    """The group's group_size engine requests, sample i with the config sampling and its own seed from the run
    seed, the group id and i (a sample's draws never depend on what else the engine runs)."""
    return [ctx.generate(prompt_ids, dataclasses.replace(ctx.sampling, seed=sample_seed(ctx.run_seed, ticket.group_id,
                                                                                        i)))
            for i in range(ticket.group_size)]


def wants_baseline(ctx: RolloutContext) -> bool:
    """Whether this context asks for a greedy baseline reward per group (WantsRewardBaselines)."""
    return isinstance(ctx, WantsRewardBaselines) and ctx.reward_baselines


def submit_greedy(ctx: RolloutContext, prompt_ids: list[int]) -> Future[Generation]:
    """The group's greedy request: the config sampling at temperature 0 (top-p / top-k then change nothing)."""
    return ctx.generate(prompt_ids, dataclasses.replace(ctx.sampling, temperature=0.0, seed=None))


def greedy_sample(ctx: RolloutContext, prompt_ids: list[int], ticket: GroupTicket,
                  future: Future[Generation]) -> Sample:
    """The sample of the greedy request, indexed past the group (group_size): it is scored, never put."""
    return sample_of(ctx, prompt_ids, ticket, ticket.group_size, future)


def set_baseline(samples: list[Sample], greedy: Sample) -> None:
    """Set greedy's reward as reward_baseline of every sample; a greedy sample that was not scored (the engine or
    the reward failed, or it was aborted) fails the group's scored samples instead: without its baseline ReMax
    cannot train on them, and the buffer drops a group's FAILED samples."""
    scored = greedy.status in (Status.COMPLETED, Status.TRUNCATED)
    for s in samples:
        if scored:
            s.reward_baseline = greedy.reward
        elif s.status not in (Status.FAILED, Status.ABORTED):
            s.status = Status.FAILED
            s.status_reason = f"the greedy baseline response failed: {greedy.status.name} {greedy.status_reason}"


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
    versions = tuple(gen.token_versions)
    if versions and len(set(versions)) > 1:          # the weights changed mid-sequence (in-place update)
        sample.token_versions = list(versions)
    if gen.routed_experts is not None:               # MoE: per-token expert ids for routing replay (R3)
        sample.routed_experts = RoutedExperts(ids=gen.routed_experts)
    return sample
