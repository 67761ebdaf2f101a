"""trainer.profile: torch profiler Chrome traces of chosen trainer steps, and of the replicas' decode under the weight
versions those steps train (rlfleet/runtime/torch_profile.py writes them; docs/profiling.md says how to open them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlfleet.config.section import Section


class ProfileConfig(Section):
    """Which trainer steps to profile and what the traces hold. Off (no step listed) by default."""

    steps: list[int] = Field([], description="Trainer steps to profile, counted from 0 as in metrics/trainer.jsonl: "
                             "each writes RUN_DIR/profile/trainer-step-N-rankR.json. Each replica of the torch engine "
                             "writes RUN_DIR/profile/<replica>-vV.json for the weight version V = N // "
                             "trainer.publish_every that step N trains from.")
    rollout: bool = Field(True, description="Also trace the replicas' decode under those weight versions (torch "
                          "engine only).")
    rollout_steps: int = Field(64, ge=1, description="Most engine steps (prefill + decode of the running batch) "
                               "traced per weight version: the trace is written when they are done, when the "
                               "replica loads the next version, or when it stops.")
    activities: list[Literal["cpu", "cuda"]] | None = Field(None, description="Profiler activities (null: cpu, "
                                                            "plus cuda where the process runs on a CUDA device).")
    record_shapes: bool = Field(False, description="Record each op's input shapes (bigger traces).")
    with_stack: bool = Field(False, description="Record the Python stack of each op (much bigger, slower traces).")
    profile_memory: bool = Field(False, description="Record tensor allocations and frees.")

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: list[int]) -> list[int]:
        bad = [s for s in steps if s < 0]
        if bad:
            raise ValueError(f"steps are counted from 0; got {bad}")
        return sorted(set(steps))

    def versions(self, publish_every: int) -> list[int]:
        """The weight versions the profiled steps train from: the trainer holds version step // publish_every when a
        step starts (version v is published after step v * publish_every - 1)."""
        return sorted({s // publish_every for s in self.steps})
