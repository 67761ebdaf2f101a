"""What the controller needs to know about its run; built from the command line (the chart passes every flag)."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    namespace: str
    release: str
    identity: str                              # this controller's name in the Lease
    quarantine_label: str = "rlfleet.io/quarantined"
    quarantine_taint: str = "rlfleet.io/quarantined"
    hung_after: float = 900.0                  # seconds without a trainer step (while batches are ready)
    replica_dead_after: float = 300.0          # seconds a rollout pod may stay not Ready
    recovery_timeout: float = 1800.0           # a recovery not finished by then is declared failed
    lease_seconds: float = 30.0
    config_path: str | None = None             # the run config: endpoints for Trainer.Status / Buffer.Stats
    metrics_port: int = 0
    tick_seconds: float = 5.0

    @property
    def run_selector(self) -> str:
        return f"app.kubernetes.io/name=rlfleet,app.kubernetes.io/instance={self.release}"

    @property
    def lease_name(self) -> str:
        return f"{self.release}-controller"

    @property
    def state_name(self) -> str:
        return f"{self.release}-controller-state"


def parse_settings(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(prog="python -m rlfleet.services.controller")
    p.add_argument("--namespace", required=True)
    p.add_argument("--release", required=True)
    p.add_argument("--config", default=None, help="the run config (its endpoints section)")
    p.add_argument("--metrics-port", type=int, default=0)
    p.add_argument("--quarantine-label", default="rlfleet.io/quarantined")
    p.add_argument("--quarantine-taint", default="rlfleet.io/quarantined")
    p.add_argument("--hung-after", type=float, default=900.0)
    p.add_argument("--replica-dead-after", type=float, default=300.0)
    p.add_argument("--recovery-timeout", type=float, default=1800.0)
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname())
    ns = p.parse_args(argv)
    return Settings(namespace=ns.namespace, release=ns.release, identity=ns.identity,
                    quarantine_label=ns.quarantine_label, quarantine_taint=ns.quarantine_taint,
                    hung_after=ns.hung_after, replica_dead_after=ns.replica_dead_after,
                    recovery_timeout=ns.recovery_timeout, config_path=ns.config, metrics_port=ns.metrics_port)
