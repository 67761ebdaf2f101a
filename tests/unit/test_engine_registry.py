"""The engine registry (rlfleet/services/rollout/engines/registry.py): every engine name the config accepts is
registered, every registered engine is one the config accepts, and an unknown name is refused with the known ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest

from rlfleet.config import RolloutConfig, load_config
from rlfleet.services.rollout.engines import ENGINES, make_engine
from rlfleet.services.rollout.engines.base import EngineError

CONFIG = Path(__file__).resolve().parents[2] / "examples/addition/config.yaml"


def test_every_engine_the_config_allows_is_registered_and_no_other() -> None:
    annotation = RolloutConfig.model_fields["engine"].annotation
    assert get_origin(annotation) is Literal
    assert set(get_args(annotation)) == set(ENGINES)


def test_each_record_is_named_by_its_key_and_described() -> None:
    for name, spec in ENGINES.items():
        assert spec.name == name and spec.description.strip() and callable(spec.build)
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.name = "other"  # type: ignore[misc]


def test_an_unknown_engine_is_refused_naming_the_known_ones() -> None:
    cfg = load_config(CONFIG)
    unknown = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "vllm"})})
    with pytest.raises(EngineError, match="'vllm' is not available.*known engines: sglang, torch"):
        make_engine(unknown)
