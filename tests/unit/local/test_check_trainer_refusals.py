"""A config the trainer refuses at start-up from its values alone is refused by `rlfleet check` too, with the same
message: examples/addition/config.yaml with one bad field, checked by the CLI in its own process, and the trainer's
start-up validation (rlfleet/services/trainer/service.py `validate`) given the same config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlfleet.config import ConfigError, parse_config
from rlfleet.services.trainer.service import validate

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "addition" / "config.yaml"
ENDPOINTS = {"buffer": "h:1", "weight_sync": "h:2", "trainer": "h:3", "trainer_data": "h:4"}

CASES = [
    ({"groups_per_step": 30, "minibatches": 4},
     "trainer.groups_per_step=30 must be divisible by data-parallel ranks*minibatches=1*4: each rank trains on "
     "whole groups"),
    ({"backend": "megatron", "world_size": 3, "megatron": {"tensor_parallel": 2}},
     "trainer.world_size=3 is not a multiple of trainer.megatron.tensor_parallel*pipeline_parallel=2*1"),
    ({"backend": "megatron", "world_size": 4, "groups_per_step": 31, "megatron": {"tensor_parallel": 2}},
     "trainer.groups_per_step=31 must be divisible by data-parallel ranks*minibatches=2*1: each rank trains on "
     "whole groups"),
    ({"backend": "megatron", "kl": {"coef": 0.1}},
     "trainer.backend megatron does not support trainer.kl.coef > 0; use the fsdp backend"),
    ({"backend": "megatron", "algorithm": "ppo", "policy_loss": {"entropy_coef": 0.01}},
     "trainer.backend megatron does not support trainer.algorithm ppo (a critic), "
     "trainer.policy_loss.entropy_coef > 0; use the fsdp backend"),
    ({"algorithm": "distill"}, "trainer.algorithm distill needs trainer.teacher.model_path"),
]


def _example_with(trainer: dict[str, Any]) -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["trainer"].update(trainer)
    return data


@pytest.mark.parametrize(("trainer", "message"), CASES)
def test_rlfleet_check_refuses_what_the_trainer_refuses(tmp_path: Path, trainer: dict[str, Any],
                                                        message: str) -> None:
    data = _example_with(trainer)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    done = subprocess.run([sys.executable, "-m", "rlfleet.cli", "check", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"rlfleet: {message}"
    cfg = parse_config({**data, "endpoints": ENDPOINTS})
    with pytest.raises(ConfigError) as refused:
        validate(cfg, cfg.trainer.world_size)
    assert str(refused.value) == message


def test_the_example_passes_the_trainer_checks() -> None:
    cfg = parse_config({**_example_with({}), "endpoints": ENDPOINTS})
    validate(cfg, cfg.trainer.world_size)


def test_the_sdk_and_the_trainer_backends_count_the_same_data_parallel_ranks() -> None:
    from rlfleet.config import data_parallel_ranks
    from rlfleet.services.trainer.backends import BACKENDS, data_parallel_size

    for backend in BACKENDS:
        for world, tp, pp in ((1, 1, 1), (4, 2, 1), (8, 2, 2), (6, 1, 3)):
            cfg = parse_config({**_example_with({"backend": backend, "world_size": world, "groups_per_step": 48,
                                                 "megatron": {"tensor_parallel": tp, "pipeline_parallel": pp}}),
                                "endpoints": ENDPOINTS})
            assert data_parallel_size(cfg, world) == data_parallel_ranks(cfg.trainer)
    # megatron: world / (tp * pp); fsdp: every rank
    cfg = parse_config({**_example_with({"backend": "megatron", "world_size": 8, "megatron": {"tensor_parallel": 2}}),
                        "endpoints": ENDPOINTS})
    assert data_parallel_ranks(cfg.trainer) == 4
