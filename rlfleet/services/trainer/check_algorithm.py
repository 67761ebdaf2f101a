"""python -m rlfleet.services.trainer.check_algorithm < TRAINER_SECTION.json: resolve the algorithm, advantage and loss
names of a trainer config section without starting anything. Exit 0, or 2 with the reason on stderr.

`rlfleet check` runs this as a subprocess: the SDK imports no service (the trainer owns its registry)."""

from __future__ import annotations

import json
import sys

from rlfleet.config import TrainerConfig
from rlfleet.services.trainer.algorithms import resolve


def check(section: str) -> str:
    """The one-line reason a trainer section (JSON) is refused, "" when its names resolve. Also asked of a warm
    trainer interpreter (rlfleet/local/warm_interpreter.py) by `rlfleet run`."""
    try:
        resolve(TrainerConfig.model_validate(json.loads(section)))
    except Exception as exc:  # noqa: BLE001 - any refusal becomes the one-line reason check prints
        return " ".join(str(exc).split()) or type(exc).__name__
    return ""


def main() -> int:
    reason = check(sys.stdin.read())
    if reason:
        print(reason, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
