"""The calculator example's warm-started tiny model (~0.1M parameters), built once into the user cache."""

from __future__ import annotations

from pathlib import Path


def calculator_model_dir() -> Path:
    from examples.calculator.warm_start import SFT_STEPS, prepare

    path = Path.home() / ".cache" / "rlfleet" / f"calculator-warm-start-{SFT_STEPS}"
    prepare(str(path), seed=0)
    return path
