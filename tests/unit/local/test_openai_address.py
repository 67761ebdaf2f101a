"""The OpenAI gateway's port and the endpoint's key stay the same across `rlfleet run --resume` (an agent outside the
run reconnects with what it had); a fresh launch makes a new key."""

from __future__ import annotations

import socket
from pathlib import Path

from rlfleet.config import parse_config
from rlfleet.local.openai_address import gateway_port, key_location
from rlfleet.security.run_material import OPENAI_API_KEY, prepare_security


def _cfg(run_dir: Path):
    return parse_config({"run": {"name": "x", "dir": str(run_dir)}, "model": {"path": "m"},
                         "rollout": {"data_source": "examples.addition.data:train_prompts",
                                     "reward_fn": "examples.addition.reward:exact_match",
                                     "openai": {"enabled": True}}})


def test_port_and_key_survive_resume(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path / "run")
    cfg.run_dir.mkdir(parents=True)
    port = gateway_port(cfg, resume=False)
    assert gateway_port(cfg, resume=True) == port                       # free again: the same one
    with socket.socket() as held:                                       # taken by someone else: another one
        held.bind(("127.0.0.1", port))
        held.listen()
        assert gateway_port(cfg, resume=True) != port

    sec = prepare_security(cfg, cfg.run_dir)
    key_file = Path(sec["pki_dir"]) / OPENAI_API_KEY
    key = key_file.read_bytes()
    prepare_security(cfg, cfg.run_dir, resume=True)
    assert key_file.read_bytes() == key
    prepare_security(cfg, cfg.run_dir)                                  # a fresh launch: a new key
    assert key_file.read_bytes() != key
    resolved = parse_config({**cfg.model_dump(mode="json"), "security": sec})
    assert key_location(resolved) == f"key in {key_file}"
