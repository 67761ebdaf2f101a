"""The rollout function for agents that run outside the run: `rollout.rollout_fn: external_sessions` (with
`rollout.openai.enabled: true`).

An external agent (its own process or harness, any language, e.g. the `openai` client) runs episodes on the run's
OpenAI endpoint, each under a session id (`X-Session-Id`), and posts `{"reward": r, "group": key}` to
`/v1/sessions/<id>/reward` when an episode ends. The replica holds rewarded sessions
(rlfleet/services/rollout/openai_api/rewarded.py); this function fills each group ticket the buffer issues with
rollout.group_size of them (one group key's, else in arrival order) and yields their samples: the session's exact
TITO ids, loss mask, logprobs and weight versions, the agent's reward. They are put, stamped and checked like every
other sample (the buffer's staleness bound, the run's identities): a session recorded on weights older than
buffer.max_staleness allows is dropped as stale, with the reason counted.

The ticket's prompt (from the run's data source) is not used: the agent chooses its own tasks. The data source still
names the held-out prompts the run evaluates on.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlfleet.protocols import GroupTicket, Prompt, RolloutContext
from rlfleet.sample import Sample
from rlfleet.services.rollout.context import GroupAborted, GroupContext
from rlfleet.services.rollout.openai_api.endpoint import endpoint_of

POLL_SECONDS = 0.5          # how often a waiting group looks whether the work loop aborted it


def external_sessions(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
    """Wait for a group of rewarded external sessions, then yield them as the ticket's samples."""
    endpoint = endpoint_of(ctx)
    while True:
        if isinstance(ctx, GroupContext) and ctx.aborted:     # the buffer took the ticket back, or the run ends
            raise GroupAborted("the group was aborted while it waited for rewarded sessions")
        group = endpoint.rewarded.take_group(ticket.group_size, POLL_SECONDS)
        if group is not None:
            break
    for index, item in enumerate(group):
        sample = item.session.to_sample(ticket, index, ctx.replica_id)
        sample.reward, sample.reward_parts = item.reward, {}
        sample.metadata = {**sample.metadata, "external_session": item.session_id,
                           **({"group_key": item.group} if item.group else {})}
        yield sample
