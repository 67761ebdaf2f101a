"""The command line every service shares: --config, --listen, --metrics-port; logging; the run token."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet.config import Config, ConfigError, load_config
from rlfleet.security.credentials import load_credential
from rlfleet.security.identity import Credential
from rlfleet.security.scrub import scrub_environment
from rlfleet.security.signing import SIGNING_KEY_ENV


@dataclass(frozen=True)
class ServiceArgs:
    config: Config
    config_path: Path
    listen: str | None
    metrics_port: int
    token: Credential                 # Identity (mtls), run token (token) or None (none)
    extra: argparse.Namespace
    redis_auth: dict[str, str] = field(default_factory=dict)   # buffer: RLFLEET_REDIS_* read before the scrub


def listen_address(endpoint: str, override: str | None) -> str:
    """Bind to the endpoint's own host when it is loopback; otherwise to all interfaces on its port."""
    if override:
        return override
    host, _, port = endpoint.rpartition(":")
    if not port:
        raise ConfigError(f"endpoint '{endpoint}' has no port")
    return endpoint if host in ("127.0.0.1", "localhost", "[::1]") else f"0.0.0.0:{port}"


def with_signing_key_from_env(cfg: Config) -> Config:
    """`cfg` with security.signing_key from RLFLEET_SIGNING_KEY when set (how `rlfleet run` gives the trainer, and
    no other process, its key: the shared config does not name it)."""
    path = os.environ.get(SIGNING_KEY_ENV)
    if not path:
        return cfg
    return cfg.model_copy(update={"security": cfg.security.model_copy(update={"signing_key": path})})


def parse_service_args(name: str, argv: list[str] | None = None,
                       add_args: list[tuple[tuple[str, ...], dict]] | None = None) -> ServiceArgs:
    parser = argparse.ArgumentParser(prog=f"python -m rlfleet.services.{name}")
    parser.add_argument("--config", required=True, help="resolved run config (YAML)")
    parser.add_argument("--listen", default=None, help="HOST:PORT to serve on (default: own endpoint)")
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: off)")
    for flags, kwargs in add_args or []:
        parser.add_argument(*flags, **kwargs)
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s")
    try:
        cfg = with_signing_key_from_env(load_config(ns.config))
        token = load_credential(cfg.security, name)
    except (ConfigError, OSError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    secrets = scrub_environment()          # reward/tool plugins and child processes (SGLang) never see them
    redis_env = {k: v for k, v in secrets.items() if k.startswith("RLFLEET_REDIS_")}
    return ServiceArgs(config=cfg, config_path=Path(ns.config), listen=ns.listen, metrics_port=ns.metrics_port,
                       token=token, extra=ns, redis_auth=redis_env)


def stop_on_signals() -> threading.Event:
    """An Event set by SIGTERM or SIGINT (call from the main thread)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def serve_until(stop: threading.Event, tick: Callable[[], None] | None = None, tick_every: float = 10.0) -> None:
    """Block until stop is set, calling tick every tick_every seconds.

    Polls in short waits: a signal delivered to one of gRPC's threads only runs its Python handler when the main
    thread next runs bytecode, so one long wait would delay shutdown by that long.
    """
    next_tick = time.monotonic() + tick_every
    while not stop.wait(0.2):
        if tick is not None and time.monotonic() >= next_tick:
            next_tick = time.monotonic() + tick_every
            tick()
