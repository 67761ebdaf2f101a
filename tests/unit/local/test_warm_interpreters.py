"""Warm interpreters (rlfleet/local/warm_interpreter.py, rlfleet/local/warm_interpreters.py): a service's interpreter
started
before its run exists imports ahead, answers checks, then becomes exactly the service it is told to be -- its
argv, its environment, its log (with what the imports printed first) -- or exits having started nothing."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
import yaml

from rlfleet.config import parse_config
from rlfleet.local.placement import Placement
from rlfleet.local.warm_interpreters import WarmInterpreters, placements

SERVER = '''
import json, os, sys
from rlfleet.runtime.service_skeleton import Outcome, ServiceSpec

class Service:
    def __init__(self, args):
        out = {"argv": sys.argv[1:], "marker": os.environ.get("WARM_TEST_MARKER"),
               "heavy": "{pkg}.heavy" in sys.modules, "config_run_dir": str(args.config.run_dir)}
        print("service started", flush=True)
        with open(os.environ["WARM_TEST_OUT"], "w") as f:
            json.dump(out, f)
    def serve(self):
        return Outcome(3)
    def signalled(self, signum):
        pass
    def close(self):
        pass

SPEC = ServiceSpec(name="{pkg}", start=Service, warm=("{pkg}.heavy",))
'''


@pytest.fixture
def fake_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A service package in the current folder (the launcher puts it on the services' PYTHONPATH) and its config."""
    pkg = f"warmsvc_{uuid.uuid4().hex[:8]}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "server.py").write_text(SERVER.replace("{pkg}", pkg))
    (tmp_path / pkg / "heavy.py").write_text("import sys\nprint('heavy imported', file=sys.stderr)\n"
                                            "print('{\"error\": \"noise an import printed to stdout\"}')\n")
    (tmp_path / pkg / "check.py").write_text("def check(text):\n    return '' if text == 'fine' else 'bad: ' + text\n")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"run": {"dir": str(tmp_path / "run")}, "model": {"path": str(tmp_path)},
                                      "rollout": {"data_source": "x:y", "reward_fn": "x:y"},
                                      "security": {"mode": "none"}}))
    monkeypatch.chdir(tmp_path)
    return pkg, config


def _cfg(config: Path):  # noqa: ANN202
    return parse_config(yaml.safe_load(config.read_text()))


def test_it_answers_checks_then_becomes_the_service(fake_service: tuple[str, Path], tmp_path: Path) -> None:
    pkg, config = fake_service
    cfg = _cfg(config)
    warm = WarmInterpreters(cfg, services=[("svc-0", pkg)])
    try:
        assert warm.check("svc-0", f"{pkg}.check", "fine") == ""
        assert warm.check("svc-0", f"{pkg}.check", "typo") == "bad: typo"
        assert warm.check("nobody", f"{pkg}.check", "fine") is None
        out, log = tmp_path / "out.json", tmp_path / "logs" / "svc-0.log"
        env = {**os.environ, "WARM_TEST_OUT": str(out), "WARM_TEST_MARKER": "given at go"}
        proc = warm.take("svc-0", pkg, placements(cfg)["rollout-0"], ["--config", str(config)], env, log)
        assert proc is not None and proc.wait(timeout=60) == 3                     # the service's own exit code
    finally:
        warm.close()
    seen = json.loads(out.read_text())
    assert seen == {"argv": ["--config", str(config)], "marker": "given at go", "heavy": True,
                    "config_run_dir": str(tmp_path / "run")}
    text = log.read_text()
    assert text.index("heavy imported") < text.index("service started")     # the import's output, then the service's
    assert "noise an import printed to stdout" in text                       # in the log, never taken for a reply


def test_one_not_taken_exits_having_started_nothing(fake_service: tuple[str, Path], tmp_path: Path) -> None:
    pkg, config = fake_service
    cfg = _cfg(config)
    warm = WarmInterpreters(cfg, services=[("svc-0", pkg), ("svc-1", pkg)])
    procs = [w.proc for w in warm._warm.values()]
    assert warm.check("svc-0", f"{pkg}.check", "fine") == ""                 # both are up and have imported
    moved = Placement(cpus=(0,), threads=7)                                  # the run's placement changed
    assert warm.take("svc-1", pkg, moved, ["--config", str(config)], dict(os.environ), tmp_path / "x.log") is None
    t0 = time.monotonic()
    warm.close()
    assert time.monotonic() - t0 < 10
    assert all(p.poll() is not None for p in procs)
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "x.log").exists()
    assert not warm._dir.exists()
