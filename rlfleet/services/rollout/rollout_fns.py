"""Built-in rollout functions (rollout.rollout_fn). Each yields a group's samples as they finish."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, wait

from rlfleet.protocols import GroupTicket, Prompt, RolloutContext, ScoresGroups
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.group_collector import CollectedRolloutFn
from rlfleet.services.rollout.group_samples import (
    greedy_sample,
    sample_of,
    set_baseline,
    submit_greedy,
    submit_group,
    wants_baseline,
)
from rlfleet.services.rollout.single_turn_groups import SingleTurnGroups


def _single_turn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
    """group_size completions of one prompt with the config sampling (a per-sample seed from the run seed).

    Whenever it wakes, it scores every completion that has finished by then in one call (`score_group`: one hand-off
    to the reward's thread for all of them, where per-sample scoring paid one each); a batched reward scores the
    whole group at the end. When the context wants a reward baseline (ReMax), one greedy completion is generated
    too, and the group is held to the end: scored with the greedy sample, which is not yielded (not trained on),
    its reward set as every sample's reward_baseline."""
    prompt_ids = ctx.encode_prompt(prompt)
    futures = {f: i for i, f in enumerate(submit_group(ctx, prompt_ids, ticket))}
    greedy = submit_greedy(ctx, prompt_ids) if wants_baseline(ctx) else None
    held: list[Sample] = []                          # scored at once, at the end
    scoring = ctx if isinstance(ctx, ScoresGroups) else None
    hold = greedy is not None or (scoring is not None and scoring.batched_reward)
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        ready = [sample_of(ctx, prompt_ids, ticket, futures[f], f) for f in sorted(done, key=futures.__getitem__)]
        failed = [s for s in ready if s.status == Status.FAILED]
        scorable = [s for s in ready if s.status != Status.FAILED]
        yield from failed
        if hold:
            held += scorable
        else:
            yield from _scored(ctx, scoring, prompt, scorable)
    if greedy is None:
        yield from _scored(ctx, scoring, prompt, held)
        return
    baseline = greedy_sample(ctx, prompt_ids, ticket, greedy)
    _scored(ctx, scoring, prompt, held + ([baseline] if baseline.status != Status.FAILED else []))
    set_baseline(held, baseline)
    yield from held


def _scored(ctx: RolloutContext, scoring: ScoresGroups | None, prompt: Prompt, samples: list[Sample]) -> list[Sample]:
    """samples scored together (score_group) where the context can, else one at a time."""
    if not samples:
        return samples
    if scoring is not None:
        return scoring.score_group(prompt, samples)
    return [ctx.score(prompt, s) for s in samples]


single_turn = CollectedRolloutFn(_single_turn, SingleTurnGroups, supplies_reward_baselines=True)
"""The built-in rollout function: `_single_turn` for one group; its declared collector (SingleTurnGroups) runs every
group of a replica on one thread, with the same samples (perf.single_turn_collector). Both supply the greedy reward
baseline when the context wants it (rlfleet.protocols.SuppliesRewardBaselines)."""
