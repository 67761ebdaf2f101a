"""`rollout.engine: sglang` in the config -> an SGLangEngine, either on a server someone else runs or on a local one.

The SGLang deployment settings are not part of the run config (they are per machine), so they come from the
environment of the rollout replica:
  RLFLEET_SGLANG_URL          an SGLang server to use (the server loads the same model folder; for a MoE model it
                              must run with --enable-return-routed-experts); unset: start one (with it for MoE)
  RLFLEET_SGLANG_PYTHON       the python of SGLang's own venv for a local server (default .venv-sglang/bin/python)
  RLFLEET_SGLANG_PYTHONPATH   extra PYTHONPATH for a local server (on CPU: tests/support/sglang_stub, see its doc)
  RLFLEET_SGLANG_WEIGHTS      "disk" (default) or "distributed": how verified weights reach the server
  RLFLEET_SGLANG_VERIFY       "read_back" (default) or "sent": what the acknowledged digest is computed from
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, cast

from rlfleet.config import Config
from services.rollout.engines.base import EngineError
from services.rollout.engines.sglang.client import SGLangClient
from services.rollout.engines.sglang.engine import SGLangEngine
from services.rollout.engines.sglang.routes import moe_shape
from services.rollout.engines.sglang.server import DEFAULT_PYTHON, SGLangServer, SGLangServerSpec


def engine_from_config(cfg: Config) -> SGLangEngine:
    weights = os.environ.get("RLFLEET_SGLANG_WEIGHTS", "disk")
    if weights not in ("disk", "distributed"):
        raise EngineError(f"RLFLEET_SGLANG_WEIGHTS is '{weights}', expected disk or distributed")
    weight_path = cast(Literal["disk", "distributed"], weights)
    verify = os.environ.get("RLFLEET_SGLANG_VERIFY", "read_back")
    if verify not in ("read_back", "sent"):
        raise EngineError(f"RLFLEET_SGLANG_VERIFY is '{verify}', expected read_back or sent")
    verify_mode = cast(Literal["read_back", "sent"], verify)
    concurrency = cfg.rollout.max_batch_size
    url = os.environ.get("RLFLEET_SGLANG_URL")
    if url:
        return SGLangEngine(SGLangClient(url), cfg.model_path, weight_path=weight_path, verify=verify_mode,
                            max_concurrency=concurrency)
    extra = os.environ.get("RLFLEET_SGLANG_PYTHONPATH", "")
    spec = SGLangServerSpec(model_path=cfg.model_path,
                            python=Path(os.environ.get("RLFLEET_SGLANG_PYTHON", str(DEFAULT_PYTHON))),
                            device=cfg.rollout.device.split(":")[0], dtype=cfg.model.dtype,
                            max_running_requests=cfg.rollout.max_batch_size,
                            return_routed_experts=moe_shape(cfg.model_path) is not None,
                            pythonpath=tuple(Path(p) for p in extra.split(os.pathsep) if p))
    log_dir = cfg.run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    server = SGLangServer(spec, log_path=log_dir / f"sglang-{os.getpid()}.log").start()
    return SGLangEngine(SGLangClient(server.url), cfg.model_path, server=server, weight_path=weight_path,
                        verify=verify_mode, max_concurrency=concurrency)
