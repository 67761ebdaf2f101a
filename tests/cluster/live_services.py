"""The four real services started as the chart starts them (python -m rlfleet.services.X --config --listen
--metrics-port),
on loopback, so their /metrics endpoints can be scraped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from rlfleet.runtime.ports import free_port
from tests.cluster.exported import names_in_exposition, scrape

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("buffer", "weight_sync", "trainer", "rollout")
# The metric family each service must have registered before its scrape counts as complete.
FIRST_FAMILY = {"buffer": "rlfleet_buffer_depth", "weight_sync": "rlfleet_weight_sync_published_version",
                "trainer": "rlfleet_trainer_step", "rollout": "rlfleet_rollout_queue_depth"}


def write_config(run_dir: Path, model: Path) -> tuple[Path, dict[str, int]]:
    ports = {name: free_port() for name in ("buffer", "weight_sync", "trainer", "trainer_data", "rollout",
                                            "rendezvous")}
    cfg = {
        "run": {"name": "live", "dir": str(run_dir)},
        "model": {"path": str(model)},
        "rollout": {"group_size": 2, "data_source": "examples.addition.data:train_prompts",
                    "reward_fn": "examples.addition.reward:exact_match", "sampling": {"max_new_tokens": 4},
                    "max_batch_size": 8, "claim_groups": 2},
        "buffer": {"store": "embedded", "capacity": 64},
        "trainer": {"steps": 100000, "groups_per_step": 2, "checkpoint_every": 100000},
        "security": {"mode": "none"},
        "endpoints": {"buffer": f"127.0.0.1:{ports['buffer']}", "weight_sync": f"127.0.0.1:{ports['weight_sync']}",
                      "trainer": f"127.0.0.1:{ports['trainer']}",
                      "trainer_data": f"127.0.0.1:{ports['trainer_data']}",
                      "rollout": [f"127.0.0.1:{ports['rollout']}"],
                      "rendezvous": f"127.0.0.1:{ports['rendezvous']}"},
    }
    path = run_dir / "config.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path, ports


class LiveServices:
    def __init__(self, config: Path, ports: dict[str, int], log_dir: Path) -> None:
        self.config = config
        self.ports = ports
        self.log_dir = log_dir
        self.metrics_ports = {name: free_port() for name in SERVICES}
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        env = dict(os.environ, RANK="0", WORLD_SIZE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        env.pop("RLFLEET_TOKEN", None)
        for name in SERVICES:
            args = [sys.executable, "-m", f"rlfleet.services.{name}", "--config", str(self.config),
                    "--metrics-port", str(self.metrics_ports[name])]
            if name == "rollout":
                args += ["--replica-index", "0", "--replica-id", "rollout-live-0"]
            log = (self.log_dir / f"{name}.log").open("w")
            self.procs[name] = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def scrape_all(self, timeout: float) -> dict[str, set[str]]:
        """Scrape each service until its metrics are registered; a service that died or never answered is missing."""
        found: dict[str, set[str]] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(SERVICES) and time.monotonic() < deadline:
            for name in SERVICES:
                if name in found:
                    continue
                try:
                    names = names_in_exposition(scrape(self.metrics_ports[name], timeout=2))
                except OSError:
                    continue
                if FIRST_FAMILY[name] in names:
                    found[name] = names
            time.sleep(0.5)
        return found

    def log_tail(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text()[-2000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
