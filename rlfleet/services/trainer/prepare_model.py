"""python -m rlfleet.services.trainer.prepare_model --config CONFIG: build model.path with model.prepare (or convert a
GGUF model.path) before the trainer starts.

On one machine `rlfleet run`'s launcher takes this step itself (rlfleet/local/launcher.py prepare_model); on a
cluster the chart runs it as the init container of every trainer pod, so the services find the model folder the
run config names (replicas wait for it: rlfleet/services/rollout/server.py). The prepare function caches its folder
(a pod restarted later finds it built). Exit 0 when the folder is there; 2 with the reason on stderr otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys

from rlfleet.config import ConfigError, load_config
from rlfleet.plugins import PluginError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlfleet.services.trainer.prepare_model")
    parser.add_argument("--config", required=True)
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    from rlfleet.local.launcher import RunError, prepare_model

    try:
        cfg = prepare_model(load_config(ns.config))
    except (ConfigError, PluginError, RunError) as exc:
        print(f"prepare_model: {exc}", file=sys.stderr)
        return 2
    print(f"prepare_model: {cfg.model_path} ready", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
