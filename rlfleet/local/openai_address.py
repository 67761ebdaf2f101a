"""Where an external agent finds the run's OpenAI endpoint, and that it stays there across `--resume`.

The launcher fixes the gateway's port before the services start: rollout.openai.gateway_port when set, else the
port an earlier launch of this run folder used (RUN_DIR/openai_gateway.port) when it is free again, else a free port;
it is recorded in that file. The API key (RUN_DIR/pki/openai-api.key in mtls mode) is kept by a resume as well
(rlfleet/security/run_material.py), so an agent outside the run reconnects with what it had.
"""

from __future__ import annotations

import socket
from pathlib import Path

from rlfleet.config import Config
from rlfleet.run_dir.atomic import write_text_atomic
from rlfleet.runtime.ports import free_ports
from rlfleet.security.modes import security_mode
from rlfleet.security.run_material import OPENAI_API_KEY

PORT_FILE = "openai_gateway.port"
GATEWAY_FILE = "openai_gateway.json"     # {"base_url": ...}, written by the gateway while it serves


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def gateway_port(cfg: Config, resume: bool) -> int:
    """The port the run's gateway binds (see the module docstring); recorded in RUN_DIR/openai_gateway.port."""
    oc = cfg.rollout.openai
    port = oc.gateway_port
    if not port and resume:
        try:
            earlier = int((cfg.run_dir / PORT_FILE).read_text().strip())
        except (OSError, ValueError):
            earlier = 0
        port = earlier if earlier and _free(oc.bind, earlier) else 0
    port = port or free_ports(1)[0]
    write_text_atomic(cfg.run_dir / PORT_FILE, f"{port}\n")
    return port


def key_location(cfg: Config) -> str:
    """Where a client finds the endpoint's key, in words."""
    mode = security_mode(cfg.security.mode)
    if not mode.authenticates:
        return "no key (security.mode none)"
    if mode.uses_token:
        return f"key: the run token, {cfg.security.token_file}"
    if cfg.rollout.openai.api_key_file:
        return f"key in {cfg.rollout.openai.api_key_file}"
    return f"key in {Path(str(cfg.security.pki_dir)) / OPENAI_API_KEY}"


def endpoint_note(cfg: Config, base_url: str) -> str:
    return (f"rlfleet: OpenAI endpoint {base_url} ({key_location(cfg)}); external agents post a finished session's "
            f"reward to {base_url}/sessions/<id>/reward (rollout_fn external_sessions trains on them)")
