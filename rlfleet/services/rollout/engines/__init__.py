"""Inference engines a rollout replica can own (`rollout.engine` in the config), found through registry.py.

base.py holds the Engine contract; torch_engine.py the built-in engine, whose forwards run through a Decoder
(decoder.py: hf_decoder.py, or the lean Llama-family path behind its door, lean_llama/); sglang/ the SGLang engine.
"""

from __future__ import annotations

from rlfleet.services.rollout.engines.registry import ENGINES, EngineSpec, make_engine

__all__ = ["ENGINES", "EngineSpec", "make_engine"]
