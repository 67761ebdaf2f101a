"""Start a replica's OpenAI endpoint from the run config, and say where it is: RUN_DIR/openai/<replica>.json holds
{replica_id, base_url, rollout} (the replica's gRPC endpoint: the gateway's router keys replicas by it)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfleet.config import Config
from rlfleet.protocols import SamplingParams
from rlfleet.run_dir.atomic import write_text_atomic
from rlfleet.security.identity import Credential
from rlfleet.services.rollout.engines.base import Engine
from rlfleet.services.rollout.openai_api.app import AppSettings, OpenAIApp
from rlfleet.services.rollout.openai_api.credentials import api_keys, tls_files
from rlfleet.services.rollout.openai_api.endpoint import OpenAIEndpoint
from rlfleet.services.rollout.openai_api.server import OpenAIServer
from rlfleet.services.rollout.openai_api.sessions import SessionStore

log = logging.getLogger(__name__)

ADDRESS_DIR = "openai"


def model_context(model_path: Path) -> int | None:
    """The model's positions (config.json max_position_embeddings), or None when the folder does not say."""
    try:
        value = json.loads((model_path / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


@dataclass
class ReplicaEndpoint:
    server: OpenAIServer
    endpoint: OpenAIEndpoint
    address_file: Path

    def stop(self) -> None:
        self.server.stop()
        self.address_file.unlink(missing_ok=True)


def start_openai_endpoint(cfg: Config, credential: Credential, index: int, replica_id: str, grpc_endpoint: str,
                          engine: Engine, tokenizer: Any, sampling: SamplingParams) -> ReplicaEndpoint:
    """ConfigError when the key cannot be read; OSError when the port cannot be bound."""
    oc = cfg.rollout.openai
    keys = api_keys(cfg, credential)
    key = keys[0] if keys else None
    store = SessionStore(tokenizer, oc.max_sessions)
    app = OpenAIApp(engine, tokenizer, sampling, store,
                    AppSettings(model_name=cfg.run.name, max_context=model_context(cfg.model_path),
                                request_timeout=oc.request_timeout))
    server = OpenAIServer(app, oc.bind, oc.port + index if oc.port else 0, keys, replica_id,
                          tls=tls_files(cfg, replica_id), max_connections=oc.max_connections).start()
    address_file = cfg.run_dir / ADDRESS_DIR / f"{replica_id}.json"
    address_file.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(address_file, json.dumps({"replica_id": replica_id, "base_url": server.base_url,
                                                "rollout": grpc_endpoint}))
    log.info("replica %s serves the OpenAI API at %s (%s)", replica_id, server.base_url,
             "no key" if not keys else f"{len(keys)} bearer key(s)")
    return ReplicaEndpoint(server, OpenAIEndpoint(server.base_url, key or "none", store, app.abort_sessions,
                                                   app.rewarded),
                           address_file)

