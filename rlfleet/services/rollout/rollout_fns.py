"""Built-in rollout functions (rollout.rollout_fn). Each yields a group's samples as they finish."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, wait

from rlfleet.protocols import GroupTicket, Prompt, RolloutContext, ScoresGroups
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.group_collector import CollectedRolloutFn
from rlfleet.services.rollout.group_samples import sample_of, submit_group
from rlfleet.services.rollout.single_turn_groups import SingleTurnGroups


def _single_turn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
    """group_size completions of one prompt with the config sampling (a per-sample seed from the run seed).

    Whenever it wakes, it scores every completion that has finished by then in one call (`score_group`: one hand-off
    to the reward's thread for all of them, where per-sample scoring paid one each); a batched reward scores the
    whole group at the end."""
    prompt_ids = ctx.encode_prompt(prompt)
    futures = {f: i for i, f in enumerate(submit_group(ctx, prompt_ids, ticket))}
    held: list[Sample] = []                          # a batched reward scores the group at once, at the end
    scoring = ctx if isinstance(ctx, ScoresGroups) else None
    batched = scoring is not None and scoring.batched_reward
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        ready = [sample_of(ctx, prompt_ids, ticket, futures[f], f) for f in sorted(done, key=futures.__getitem__)]
        failed = [s for s in ready if s.status == Status.FAILED]
        scorable = [s for s in ready if s.status != Status.FAILED]
        yield from failed
        if batched:
            held += scorable
        elif scoring is not None:
            yield from scoring.score_group(prompt, scorable)
        else:
            yield from (ctx.score(prompt, s) for s in scorable)
    if held and scoring is not None:
        yield from scoring.score_group(prompt, held)


single_turn = CollectedRolloutFn(_single_turn, SingleTurnGroups)
"""The built-in rollout function: `_single_turn` for one group; its declared collector (SingleTurnGroups) runs every
group of a replica on one thread, with the same samples (perf.single_turn_collector)."""
