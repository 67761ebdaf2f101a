"""The run's OpenAI gateway as a process: python -m rlfleet.services.rollout.openai_api --config X

Routes every request of a session to one replica's endpoint (rlfleet/services/rollout/openai_api/gateway.py) over the
replicas listed in RUN_DIR/openai/; writes its own address to RUN_DIR/openai_gateway.json and serves until SIGTERM.
It holds the run's API key and no gRPC credential.
"""

from __future__ import annotations

import argparse
import json
import logging
import ssl
import sys
from pathlib import Path

from rlfleet.config import ConfigError, load_config
from rlfleet.local.openai_address import GATEWAY_FILE
from rlfleet.run_dir.atomic import write_text_atomic
from rlfleet.runtime.service_main import serve_until, stop_on_signals
from rlfleet.security.credentials import read_token
from rlfleet.security.modes import security_mode
from rlfleet.security.pki import CA_CERT
from rlfleet.services.rollout.openai_api.credentials import LOOPBACK, api_keys
from rlfleet.services.rollout.openai_api.gateway import OpenAIGateway, Routes, http_router, replicas_in
from rlfleet.services.rollout.openai_api.serve import ADDRESS_DIR

__all__ = ["GATEWAY_FILE", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlfleet.services.rollout.openai_api")
    parser.add_argument("--config", required=True, help="resolved run config (YAML)")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s openai-gateway %(levelname)s %(message)s")
    try:
        cfg = load_config(ns.config)
        mode = security_mode(cfg.security.mode)
        token = read_token(cfg.security.token_file) if mode.uses_token else None
        keys = api_keys(cfg, token)
    except (ConfigError, OSError) as exc:
        print(f"openai-gateway: {exc}", file=sys.stderr)
        return 2
    oc = cfg.rollout.openai
    tls = None
    if mode.uses_pki and oc.bind not in LOOPBACK and cfg.security.pki_dir:
        tls = ssl.create_default_context(cafile=str(Path(cfg.security.pki_dir) / CA_CERT))
    folder = cfg.run_dir / ADDRESS_DIR
    stop = stop_on_signals()
    gateway = OpenAIGateway(Routes(lambda: replicas_in(folder), http_router(tls)), oc.bind, oc.gateway_port, keys,
                            tls, oc.max_connections).start()
    write_text_atomic(cfg.run_dir / GATEWAY_FILE, json.dumps({"base_url": gateway.base_url}))
    logging.getLogger("rlfleet.services.rollout.openai_api").info("OpenAI gateway for the run's replicas at %s",
                                                          gateway.base_url)
    try:
        serve_until(stop)
    finally:
        gateway.stop()
        (cfg.run_dir / GATEWAY_FILE).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
