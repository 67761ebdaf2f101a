"""Every engine a rollout replica can own, by the name `rollout.engine` selects: one record each, one mapping.

A record's builder imports its engine's module when called, so naming an engine loads only that engine's code
(torch and transformers for `torch`, the HTTP client for `sglang`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlfleet.config import Config
from rlfleet.services.rollout.engines.base import Engine, EngineError


@dataclass(frozen=True)
class EngineSpec:
    """One engine: its `rollout.engine` name, how to build it from the run's config, and what it is."""

    name: str
    build: Callable[[Config], Engine]
    description: str


def _torch(cfg: Config) -> Engine:
    from rlfleet.model_specs import load_specs
    from rlfleet.services.rollout.engines.torch_engine import TorchEngine

    return TorchEngine(cfg.model_path, max_batch_size=cfg.rollout.max_batch_size, device=cfg.rollout.device,
                       dtype=cfg.model.dtype, seed=cfg.run.seed, on_policy=cfg.trainer.on_policy,
                       fast_decode=cfg.perf.engine_fast_decode, compile=cfg.perf.engine_compile,
                       onednn=cfg.perf.onednn_linear, native_attention=cfg.perf.native_attention,
                       model_specs=load_specs(cfg.model.specs))


def _sglang(cfg: Config) -> Engine:
    from rlfleet.services.rollout.engines.sglang.factory import engine_from_config

    return engine_from_config(cfg)


ENGINES: dict[str, EngineSpec] = {spec.name: spec for spec in (
    EngineSpec("torch", _torch, "built in: any HF causal LM, continuous batching with a KV cache, CPU or GPU"),
    EngineSpec("sglang", _sglang, "an SGLang server (started per replica, or rollout.sglang.url) over its HTTP API"),
)}


def make_engine(cfg: Config) -> Engine:
    """The engine `cfg.rollout.engine` names, built from cfg; EngineError naming the known engines otherwise."""
    spec = ENGINES.get(cfg.rollout.engine)
    if spec is None:
        raise EngineError(f"rollout.engine '{cfg.rollout.engine}' is not available in this build "
                          f"(known engines: {', '.join(sorted(ENGINES))})")
    return spec.build(cfg)
