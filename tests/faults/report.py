"""The fault harness's table: per store and fault kind, trials, samples acknowledged, lost, trained twice, hung
(no recovery), silent (damage no log reported) and recovery seconds (median and max) to serving and to the next
committed step. acked, lost and twice are totals over the runs in which that kind was injected (a run mixes kinds)."""

from __future__ import annotations

import statistics

from tests.faults.ledger import Verdict

HEADER = ("| store | fault | trials | acked | lost | twice | hung | silent | serving s (median / max) "
          "| next step s (median / max) |\n|---|---|---|---|---|---|---|---|---|---|")


def span(times: list[float]) -> str:
    return f"{statistics.median(times):.2f} / {max(times):.2f}" if times else "-"


def markdown_table(verdicts: dict[str, list[Verdict]]) -> str:
    rows = [HEADER]
    for store, runs in verdicts.items():
        kinds = sorted({k for v in runs for k in (*v.recovered, *v.unrecovered)})
        for kind in kinds:
            with_kind = [v for v in runs if kind in v.recovered or kind in v.unrecovered]
            trials = sum(v.recovered.get(kind, 0) + v.unrecovered.get(kind, 0) for v in with_kind)
            rows.append(" | ".join([
                f"| {store}", kind, str(trials), str(sum(v.put for v in with_kind)),
                str(sum(len(v.lost) for v in with_kind)), str(sum(len(v.trained_twice) for v in with_kind)),
                str(sum(v.unrecovered.get(kind, 0) for v in with_kind)),
                str(sum(v.silent.get(kind, 0) for v in with_kind)),
                span([t for v in with_kind for t in v.serving_s.get(kind, [])]),
                span([t for v in with_kind for t in v.step_s.get(kind, [])])]) + " |")
    return "\n".join(rows)
