"""The group-collector contract: a rollout function may declare a collector, its own implementation for many groups
of a replica at once on one thread (no thread per group), producing the samples the function would yield.

The work loop asks a rollout function for its declaration (`CollectedRolloutFn.collector`) when
perf.single_turn_collector is on, and otherwise runs it on a thread per group. The built-in `single_turn` declares
`SingleTurnGroups` (single_turn_groups.py); a rollout function without a declaration (a plain function, or one that
wraps `single_turn`) always gets a thread per group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from rlfleet.protocols import DataSource, Generation, GroupTicket, Prompt, RolloutContext, RolloutFn
from rlfleet.sample import Sample
from rlfleet.services.rollout.context import GroupContext


@dataclass
class StartedGroup:
    """One group through the collector. done resolves once the work loop has put the group (its claim slot frees)."""

    ticket: GroupTicket
    gctx: GroupContext
    done: Future[None]
    prompt: Prompt | None = None
    prompt_ids: list[int] = field(default_factory=list)
    requests: list[Future[Generation]] = field(default_factory=list)
    greedy: Future[Generation] | None = None     # the greedy baseline request, when the context wants one (ReMax)
    samples: list[Sample] = field(default_factory=list)          # built and scored by the collector
    error: str | None = None          # why the group could not start (then it has no samples) ...
    aborted: bool = False             # ... because the work loop had aborted it already


FinishGroups = Callable[[Sequence[StartedGroup]], None]     # the work loop: put these completed groups


class GroupCollector(Protocol):
    """start(ticket, gctx, done) on any thread; finish(groups) is called on the collector's thread with each batch
    of completed groups, samples scored; close() ends the collector after what is queued."""

    def start(self, ticket: GroupTicket, gctx: GroupContext, done: Future[None]) -> None: ...

    def close(self) -> None: ...


class GroupCollectorFactory(Protocol):
    """A collector for one replica: its context, its prompts, and where completed groups go."""

    def __call__(self, ctx: RolloutContext, data: DataSource, finish: FinishGroups) -> GroupCollector: ...


@dataclass(frozen=True)
class CollectedRolloutFn:
    """A rollout function that declares its group collector. Called, it is `fn` (one group, on the caller's
    thread); the work loop may instead run all its groups through `collector` (the same samples)."""

    fn: RolloutFn
    collector: GroupCollectorFactory
    supplies_reward_baselines: bool = False      # rlfleet.protocols.SuppliesRewardBaselines (fn and collector both)

    def __call__(self, ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        return self.fn(ctx, prompt, ticket)
