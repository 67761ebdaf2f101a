"""The data replica's rollout function (rollout.rollout_fn: rlfleet.services.rollout.labelled:labelled): supervised
fine-tuning through the same buffer and trainer as RL.

Instead of generating, it turns each data row into a sample whose response is the row's target (its label, or the
assistant turn of its messages: rlfleet/data/labels.py) and Puts it to the buffer like any sample, so SFT keeps the
one path of RL: samples signed by the replica, leased and committed by the buffer, delivered in steps by its gate,
trained on by the `sft` preset (masked token NLL on the response tokens: rlfleet/services/trainer/losses.py SftLoss),
checkpointed and exported to final/. Each sample carries the weight version the replica serves (its samples pass the
staleness gate like generated ones); its rollout logprobs are 0 (the sft loss does not read them) and its reward is
1.0 (the target is by definition the answer; the reward function is not called). rollout.group_size copies of a row
make its group: use group_size 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rlfleet.data.labels import labelled_ids
from rlfleet.protocols import GroupTicket, Prompt, RolloutContext, ServesWeightVersion
from rlfleet.sample import Sample, Status


@dataclass(frozen=True)
class LabelledRollout:
    """RolloutFn (rlfleet.protocols) that yields a row's target as the response; declares ReadsLabels."""

    needs_labels: bool = True

    def __call__(self, ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        if not isinstance(ctx, ServesWeightVersion):
            raise TypeError("rollout_fn labelled needs a context that says its weight version "
                            "(rlfleet.protocols.ServesWeightVersion)")
        prompt_ids, target = labelled_ids(ctx.tokenizer, ctx.encode_prompt, prompt)
        version = ctx.weight_version
        for i in range(ticket.group_size):
            yield Sample(group_id=ticket.group_id, index=i, group_size=ticket.group_size, prompt_ids=list(prompt_ids),
                         response_ids=list(target), rollout_logprobs=[0.0] * len(target),
                         prompt_index=ticket.prompt_index, replica_id=ctx.replica_id, reward=1.0,
                         weight_version=version, status=Status.COMPLETED)


labelled = LabelledRollout()
