"""`rollout.engine: sglang` in the config -> an SGLangEngine, on a server someone else runs or on one it starts.

Every setting is `rollout.sglang` in the run config (rlfleet/config/:SGLangConfig): TP size, memory fraction, KV
size, weight path, verification, extra flags. Three machine-local paths may be overridden from the environment:
  RLFLEET_SGLANG_URL          rollout.sglang.url: an SGLang server to use (it loads the same model folder; for a MoE
                              model it must run with --enable-return-routed-experts)
  RLFLEET_SGLANG_PYTHON       rollout.sglang.python: the python of SGLang's own environment
  RLFLEET_SGLANG_PYTHONPATH   rollout.sglang.pythonpath (os.pathsep-separated): e.g. tests/support/sglang_stub on CPU
A server this replica starts gets a fresh random API key that only this replica holds (in a 0600 file that
sglang reads at start, never on its command line: rlfleet/services/rollout/engines/sglang/server.py).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from rlfleet.config import Config
from rlfleet.services.rollout.engines.base import EngineError
from rlfleet.services.rollout.engines.sglang.client import SGLangClient
from rlfleet.services.rollout.engines.sglang.engine import SGLangEngine
from rlfleet.services.rollout.engines.sglang.routes import moe_shape
from rlfleet.services.rollout.engines.sglang.server import SGLangServer, SGLangServerSpec


def _read_key(path: str) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise EngineError(f"rollout.sglang.api_key_file {path}: {exc.strerror}") from None


def engine_from_config(cfg: Config) -> SGLangEngine:
    sg = cfg.rollout.sglang
    url = os.environ.get("RLFLEET_SGLANG_URL", sg.url)
    if url:
        client = SGLangClient(url, api_key=_read_key(sg.api_key_file))
        return SGLangEngine(client, cfg.model_path, weight_path=sg.weights, verify=sg.verify,
                            max_concurrency=cfg.rollout.max_batch_size)
    extra = os.environ.get("RLFLEET_SGLANG_PYTHONPATH")
    pythonpath = extra.split(os.pathsep) if extra is not None else sg.pythonpath
    spec = SGLangServerSpec(model_path=cfg.model_path, python=Path(os.environ.get("RLFLEET_SGLANG_PYTHON", sg.python)),
                            device=cfg.rollout.device.split(":")[0], dtype=cfg.model.dtype,
                            max_running_requests=cfg.rollout.max_batch_size, tp=sg.tp,
                            mem_fraction_static=sg.mem_fraction_static, max_total_tokens=sg.max_total_tokens,
                            return_routed_experts=moe_shape(cfg.model_path) is not None,
                            pythonpath=tuple(Path(p) for p in pythonpath if p), extra_args=tuple(sg.extra_args),
                            api_key=secrets.token_urlsafe(24))
    log_dir = cfg.run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    server = SGLangServer(spec, log_path=log_dir / f"sglang-{os.getpid()}.log").start()
    return SGLangEngine(server.client(), cfg.model_path, server=server, weight_path=sg.weights, verify=sg.verify,
                        max_concurrency=cfg.rollout.max_batch_size)
