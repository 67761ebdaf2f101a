"""A reward that takes the dataset's `kind` column as a keyword argument, and hangs on rows of kind 'hang'."""

from __future__ import annotations

import time

from rlfleet.protocols import Prompt
from rlfleet.sample import Sample


def odd_first_digit(prompt: Prompt, completion: str, sample: Sample, kind: str) -> float:
    if kind == "hang":
        time.sleep(600)
    return 1.0 if completion[:1] in ("1", "3", "5", "7", "9") else 0.0
