"""The phase progress reporter: done/total, rate and ETA on the console, and the same state through the file the
launcher reads (an evaluation inside the trainer)."""

from __future__ import annotations

import io
from pathlib import Path

from rlfleet.local.report import evals_to_come
from rlfleet.runtime.progress import PhaseProgress, format_seconds, phase_file, read_phase_files


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_show_done_total_rate_and_eta() -> None:
    out, clock = io.StringIO(), Clock()
    p = PhaseProgress("evaluation before training", 100, "prompts", stream=out, every=5.0, clock=clock)
    clock.now += 10.0
    p.advance(25)                   # 25 in 10 s: 2.5/s, 75 left: 30 s
    clock.now += 1.0
    p.advance(5)                    # within `every` of the last line: not printed
    clock.now += 9.0
    p.advance(10)                   # 40 in 20 s: 2/s, 60 left: 30 s
    clock.now += 40.0
    p.advance(60)
    p.finish()
    lines = out.getvalue().splitlines()
    assert lines == [
        "evaluation before training: 0/100 prompts (0%), 0.0 prompts/s, ETA ?",
        "evaluation before training: 25/100 prompts (25%), 2.5 prompts/s, ETA 30s",
        "evaluation before training: 40/100 prompts (40%), 2.0 prompts/s, ETA 30s",
        "evaluation before training: 100/100 prompts (100%), 1.7 prompts/s, ETA 0s",
        "evaluation before training: 100/100 prompts in 1m00s, 1.7 prompts/s",
    ]


def test_state_file_round_trips_for_the_launcher(tmp_path: Path) -> None:
    clock = Clock()
    p = PhaseProgress("evaluation at step 2", 8, "prompts", stream=None, path=phase_file(tmp_path, "eval"),
                      every=0.0, clock=clock)
    clock.now += 4.0
    p.update(2, "probe 0.25")
    state = read_phase_files(tmp_path)["eval"]
    assert (state.done, state.total, state.elapsed, state.finished) == (2.0, 8.0, 4.0, False)
    assert state.line() == "evaluation at step 2: 2/8 prompts (25%), 0.5 prompts/s, ETA 12s; probe 0.25"
    p.finish()
    assert read_phase_files(tmp_path)["eval"].finished


def test_stopping_short_of_the_most_says_so() -> None:
    out, clock = io.StringIO(), Clock()
    p = PhaseProgress("warm start", 1500, "steps", stream=out, clock=clock)
    clock.now += 80.0
    p.update(400)
    p.finish()
    assert out.getvalue().splitlines()[-1] == "warm start: 400 steps (of at most 1500) in 1m20s, 5.0 steps/s"


def test_evaluations_to_come_follow_the_trainers_schedule() -> None:
    # steps 10, every 4: evaluations after 4 and 8 steps, and after training (10)
    assert [evals_to_come(done, 10, 4) for done in (0, 3, 4, 7, 8, 9, 10)] == [3, 3, 2, 2, 1, 1, 0]
    assert evals_to_come(0, 10, 0) == 1
    assert format_seconds(3725) == "1h02m" and format_seconds(65) == "1m05s"
