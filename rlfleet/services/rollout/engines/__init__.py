"""Inference engines a rollout replica can own (`rollout.engine` in the config)."""

from __future__ import annotations

from rlfleet.config import Config
from rlfleet.services.rollout.engines.base import Engine, EngineError


def make_engine(cfg: Config) -> Engine:
    if cfg.rollout.engine == "torch":
        from rlfleet.services.rollout.engines.torch_engine import TorchEngine

        return TorchEngine(cfg.model_path, max_batch_size=cfg.rollout.max_batch_size, device=cfg.rollout.device,
                           dtype=cfg.model.dtype, seed=cfg.run.seed, on_policy=cfg.trainer.on_policy,
                           fast_decode=cfg.perf.engine_fast_decode, compile=cfg.perf.engine_compile,
                           onednn=cfg.perf.onednn_linear, native_attention=cfg.perf.native_attention)
    if cfg.rollout.engine == "sglang":
        from rlfleet.services.rollout.engines.sglang.factory import engine_from_config

        return engine_from_config(cfg)
    raise EngineError(f"rollout.engine '{cfg.rollout.engine}' is not available in this build")
