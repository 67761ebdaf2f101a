"""`rlfleet chart-check VALUES...`: print every check's finding, one a line; exit 2 when any failed."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from rlfleet.chart.checks import run_checks
from rlfleet.chart.values import ValuesError


def main(files: Sequence[Path]) -> int:
    try:
        findings = run_checks(files)
    except ValuesError as exc:
        print(f"rlfleet chart-check: {exc}", file=sys.stderr)
        return 2
    for f in findings:
        print(f"{'ok  ' if f.ok else 'FAIL'} {f.check}: {f.message}")
    failed = sum(not f.ok for f in findings)
    print(f"{' + '.join(str(p) for p in files)}: {'ok' if not failed else f'{failed} failed'}")
    return 2 if failed else 0
