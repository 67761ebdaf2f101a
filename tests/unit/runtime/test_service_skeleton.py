"""rlfleet.runtime.service_skeleton.run_service, the one skeleton the four services run on: the order start -> serve ->
close, how each ending becomes the exit code and the last stderr line, and the os._exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.config import dump_config, load_config
from rlfleet.runtime.service_main import ServiceArgs
from rlfleet.runtime.service_skeleton import Outcome, ServiceSpec, StartError, run_service

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "addition" / "config.yaml"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    dump_config(load_config(EXAMPLE, {"security.mode": "none", "run.dir": str(tmp_path / "run")}), path)
    return path


class Recording:
    """A Service that records what run_service asked of it, and ends as told."""

    def __init__(self, calls: list[str], ending: Outcome | Exception) -> None:
        self.calls, self.ending = calls, ending
        calls.append("start")

    def serve(self) -> Outcome:
        self.calls.append("serve")
        if isinstance(self.ending, Exception):
            raise self.ending
        return self.ending

    def signalled(self, signum: int) -> None:
        self.calls.append(f"signal {signum}")

    def close(self) -> None:
        self.calls.append("close")
        print("closing", file=sys.stderr)


def spec_ending(calls: list[str], ending: Outcome | Exception) -> ServiceSpec:
    def start(args: ServiceArgs) -> Recording:
        return Recording(calls, ending)

    return ServiceSpec(name="demo", start=start, signals=())


def run(spec: ServiceSpec, config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = run_service(spec, ["--config", str(config)])
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def test_a_clean_end_closes_and_exits_0(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    assert run(spec_ending(calls, Outcome()), config, capsys) == (0, "closing")
    assert calls == ["start", "serve", "close"]


def test_a_reason_is_the_last_line_after_close(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    assert run(spec_ending(calls, Outcome(3, "superseded\n  by another")), config, capsys) == (
        3, "demo: superseded by another")
    assert calls == ["start", "serve", "close"]


def test_an_error_in_serve_closes_first_then_names_it(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    assert run(spec_ending(calls, ValueError("bad batch")), config, capsys) == (1, "demo: ValueError: bad batch")
    assert calls == ["start", "serve", "close"]
    assert run(spec_ending([], RuntimeError("CUDA error: uncorrectable ECC error encountered")), config,
               capsys) == (4, "demo: RuntimeError: CUDA error: uncorrectable ECC error encountered")


def test_a_stop_asked_for_during_start_is_delivered_once_the_service_runs(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM while start() still builds the service (loading a model, say) neither kills the process outright nor
    is lost: the service is told as soon as it exists, before serve, and still closes in order."""
    import os
    import signal

    calls: list[str] = []

    def start(args: ServiceArgs) -> Recording:
        os.kill(os.getpid(), signal.SIGTERM)             # handled on this (the main) thread before start returns
        calls.append("still starting")
        return Recording(calls, Outcome())

    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = run_service(ServiceSpec(name="demo", start=start, signals=(signal.SIGTERM,)), ["--config", str(config)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 0
    assert calls == ["still starting", "start", f"signal {int(signal.SIGTERM)}", "serve", "close"]



def test_full_collections_skip_the_startup_heap_while_it_serves_and_garbage_is_still_collected(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a service built before it serves (imports, model, plugins) is not walked by the cyclic collector while it
    serves (each full collection of a replica's heap held the GIL ~0.2 s); cyclic garbage made while serving is
    still collected, and once run_service returns the collector walks everything again."""
    import gc
    import weakref

    class Node:
        def __init__(self) -> None:
            self.me = self                                    # a reference cycle: only the collector frees it

    seen: dict[str, object] = {}

    class Serving(Recording):
        def __init__(self, calls: list[str]) -> None:
            super().__init__(calls, Outcome())
            self.startup_heap = [Node() for _ in range(1000)]

        def serve(self) -> Outcome:
            tracked = {id(o) for o in gc.get_objects()}
            seen["startup heap walked"] = any(id(o) in tracked for o in self.startup_heap)
            garbage = weakref.ref(Node())
            gc.collect()
            seen["garbage collected"] = garbage() is None
            return super().serve()

    calls: list[str] = []
    service: list[Serving] = []

    def start(args: ServiceArgs) -> Serving:
        service.append(Serving(calls))
        return service[0]

    assert run_service(ServiceSpec(name="demo", start=start, signals=()), ["--config", str(config)]) == 0
    assert seen == {"startup heap walked": False, "garbage collected": True}
    assert gc.get_freeze_count() == 0
    assert gc.is_tracked(service[0].startup_heap[0])
    assert any(o is service[0].startup_heap[0] for o in gc.get_objects(generation=2))

def test_start_errors_exit_with_their_code(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(args: ServiceArgs) -> Recording:
        raise StartError("rollout.rollout_fn 'x:y': no module")

    def crash(args: ServiceArgs) -> Recording:
        raise OSError("port in use")

    assert run(ServiceSpec(name="demo", start=refuse), config, capsys) == (2, "demo: rollout.rollout_fn 'x:y': "
                                                                                "no module")
    assert run(ServiceSpec(name="demo", start=crash), config, capsys) == (1, "demo: OSError: port in use")


def test_a_bad_config_exits_2_before_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    with pytest.raises(SystemExit) as info:
        run_service(spec_ending(calls, Outcome()), ["--config", str(tmp_path / "missing.yaml")])
    assert info.value.code == 2 and calls == []
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"demo: config file {tmp_path / 'missing.yaml'} " \
                                                                 "does not exist"


def test_exit_at_once_codes_end_the_process_with_os_exit(config: Path, tmp_path: Path) -> None:
    """A thread that never ends would make interpreter exit wait for ever; os._exit does not wait."""
    script = tmp_path / "stuck.py"
    script.write_text(f'''
import threading, time
from rlfleet.runtime.service_skeleton import Outcome, ServiceSpec, run_service

class Stuck:
    def __init__(self, args):
        threading.Thread(target=time.sleep, args=(600,)).start()     # not a daemon: exit would join it
    def serve(self):
        return Outcome(3, "engine stopped serving")
    def signalled(self, signum):
        pass
    def close(self):
        pass

raise SystemExit(run_service(ServiceSpec(name="demo", start=Stuck, exit_at_once=frozenset({{3}})),
                             ["--config", {str(config)!r}]))
''')
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 3 and out.stderr.strip().splitlines()[-1] == "demo: engine stopped serving"


@pytest.mark.parametrize("module, extra", [
    ("rlfleet.services.buffer.server", []),
    ("rlfleet.services.weight_sync.server", []),
    ("rlfleet.services.rollout.server", ["--replica-index", "0"]),
    ("rlfleet.services.trainer.server", []),
])
def test_every_service_runs_on_the_skeleton(module: str, extra: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Each service's SPEC (what its `python -m rlfleet.services.<name>` runs) refuses a config it cannot read
    with exit 2 and one last line named for the service."""
    import importlib

    spec = importlib.import_module(module).SPEC
    assert isinstance(spec, ServiceSpec)
    name = module.split(".")[2]
    main = (Path(__file__).resolve().parents[3] / "rlfleet" / "services" / name / "__main__.py").read_text()
    assert f"from {module} import SPEC" in main and "run_service(SPEC)" in main
    with pytest.raises(SystemExit) as info:
        run_service(spec, ["--config", str(tmp_path / "missing.yaml"), *extra])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"{name}: config file {tmp_path / 'missing.yaml'} " \
                                                                 "does not exist"
