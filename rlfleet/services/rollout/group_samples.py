"""A single-turn group's engine requests and the samples they become: what `single_turn` and its collector
(single_turn_groups.py) both do, so the two make the same samples."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

from rlfleet.protocols import Generation, GroupTicket, RolloutContext
from rlfleet.sample import RoutedExperts, Sample, Status
from rlfleet.services.rollout.messages import sample_seed, status_of


def submit_group(ctx: RolloutContext, prompt_ids: list[int], ticket: GroupTicket) -> list[Future[Generation]]:
    """The group's group_size engine requests, sample i with the config sampling and its own seed from the run
    seed, the group id and i (a sample's draws never depend on what else the engine runs)."""
    return [ctx.generate(prompt_ids, dataclasses.replace(ctx.sampling, seed=sample_seed(ctx.run_seed, ticket.group_id,
                                                                                        i)))
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
    versions = tuple(gen.token_versions)
    if versions and len(set(versions)) > 1:          # the weights changed mid-sequence (in-place update)
        sample.token_versions = list(versions)
    if gen.routed_experts is not None:               # MoE: per-token expert ids for routing replay (R3)
        sample.routed_experts = RoutedExperts(ids=gen.routed_experts)
    return sample
