"""The command line every service shares: --config, --listen, --metrics-port; logging; the run token."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from rlfleet.config import Config, ConfigError, load_config
from rlfleet.rpc import read_token


@dataclass(frozen=True)
class ServiceArgs:
    config: Config
    config_path: Path
    listen: str | None
    metrics_port: int
    token: str | None
    extra: argparse.Namespace


def listen_address(endpoint: str, override: str | None) -> str:
    """Bind to the endpoint's own host when it is loopback; otherwise to all interfaces on its port."""
    if override:
        return override
    host, _, port = endpoint.rpartition(":")
    if not port:
        raise ConfigError(f"endpoint '{endpoint}' has no port")
    return endpoint if host in ("127.0.0.1", "localhost", "[::1]") else f"0.0.0.0:{port}"


def parse_service_args(name: str, argv: list[str] | None = None,
                       add_args: list[tuple[tuple[str, ...], dict]] | None = None) -> ServiceArgs:
    parser = argparse.ArgumentParser(prog=f"python -m services.{name}")
    parser.add_argument("--config", required=True, help="resolved run config (YAML)")
    parser.add_argument("--listen", default=None, help="HOST:PORT to serve on (default: own endpoint)")
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: off)")
    for flags, kwargs in add_args or []:
        parser.add_argument(*flags, **kwargs)
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s")
    try:
        cfg = load_config(ns.config)
        token = read_token(cfg.security.token_file) if cfg.security.mode == "token" else None
    except (ConfigError, OSError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if cfg.security.mode == "token" and not token:
        print(f"{name}: security.mode is 'token' but no token (security.token_file or RLFLEET_TOKEN)", file=sys.stderr)
        raise SystemExit(2)
    return ServiceArgs(config=cfg, config_path=Path(ns.config), listen=ns.listen, metrics_port=ns.metrics_port,
                       token=token, extra=ns)
