"""Health that means serving: a live replica whose SGLang server freezes (SIGSTOP) or dies (kill -9) turns
NOT_SERVING and exits with ENGINE_UNHEALTHY_EXIT within 15 s, so that the launcher (or Kubernetes) replaces it.

The real `python -m rlfleet.services.rollout` process, a real SGLang 0.5.23 server on CPU (the engine is pointed at it
with
RLFLEET_SGLANG_URL, so the test owns the server and can freeze or kill it), in-test Buffer and WeightSync servers.
Needs .venv-sglang (bash scripts/install_sglang_cpu.sh)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.runtime.rpc import channel
from rlfleet.services.rollout.engine_watch import ENGINE_UNHEALTHY_EXIT, EngineWatch, WatchSettings
from rlfleet.services.rollout.engines.sglang.client import SGLangClient, SGLangError
from rlfleet.services.rollout.engines.sglang.server import SGLangServer
from tests.integration.test_rollout_service import (  # noqa: F401 - `servers` is a fixture
    GROUP_SIZE,
    ROOT,
    TOKEN,
    free_port,
    servers,
    write_config,
)
from tests.support.requires import missing
from tests.support.sglang_stub import INSTALL_HINT, make_sglang_tiny_model, server_spec, sglang_python

PYTHON = sglang_python()
DETECT_WITHIN = 15.0
API_KEY = "health-test-key"


class _Flaky:
    """An engine whose health the test sets (the watcher's own logic, separate from any real engine)."""

    name = "flaky"

    def __init__(self) -> None:
        self.answers: list[bool | Exception] = []

    def healthy(self) -> bool:
        answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_watch_gives_up_only_after_consecutive_failures_and_once() -> None:
    engine, stop = _Flaky(), threading.Event()
    engine.answers = [False, False, True, False, RuntimeError("socket closed"), False, False]
    serving: list[bool] = []
    reasons: list[str] = []
    done = threading.Event()

    def lost(reason: str) -> None:
        reasons.append(reason)
        done.set()

    EngineWatch(engine, WatchSettings(interval=0.01, failures=3), serving.append, lost, stop).start()  # type: ignore[arg-type]
    assert done.wait(10)
    time.sleep(0.1)
    stop.set()
    assert serving == [False] and len(reasons) == 1, "two misses then a good answer reset the count; then three"
    assert engine.answers == [False], "it stopped asking once it gave up"
    assert "flaky" in reasons[0]


def _health(addr: str) -> int | None:
    try:
        with channel(addr, None) as ch:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
    except grpc.RpcError:
        return None


@pytest.fixture(scope="module")
def sglang_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    if PYTHON is None:
        missing(f"no SGLang venv: {INSTALL_HINT}")
    root = tmp_path_factory.mktemp("sglang-health")
    model = make_sglang_tiny_model(root / "model")
    server = SGLangServer(server_spec(model, PYTHON, api_key=API_KEY), log_path=root / "server.log")
    server.start(ready_timeout=900)
    server.model_dir = model  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


def _replica(tmp: Path, server: SGLangServer, servers_: tuple, rep: str) -> tuple[subprocess.Popen, str]:
    buffer, _, buffer_addr, ws_addr = servers_
    addr = f"127.0.0.1:{free_port()}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "sglang.key").write_text(API_KEY)
    cfg = write_config(tmp, server.model_dir, buffer_addr, ws_addr, addr, engine="sglang",  # type: ignore[attr-defined]
                       health={"interval": 1.0, "failures": 3}, sglang={"api_key_file": str(tmp / "sglang.key")})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "RLFLEET_SGLANG_URL": server.url}
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.services.rollout", "--config", str(cfg),
                             "--replica-index", "0",
                             "--replica-id", rep], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while len(buffer.samples) < GROUP_SIZE or _health(addr) != health_pb2.HealthCheckResponse.SERVING:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the replica never generated through SGLang"
        time.sleep(0.2)
    return proc, addr


def _seconds_until_replaced(proc: subprocess.Popen, addr: str) -> float:
    """Seconds from now until the replica stops answering SERVING (NOT_SERVING, or gone); it must then exit."""
    start = time.monotonic()
    detected: float | None = None
    while proc.poll() is None:
        if detected is None and _health(addr) != health_pb2.HealthCheckResponse.SERVING:
            detected = time.monotonic() - start
        assert time.monotonic() - start < 60, "the replica kept running on a dead engine"
        time.sleep(0.1)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == ENGINE_UNHEALTHY_EXIT, stderr
    assert "its engine stopped serving" in stderr
    return detected if detected is not None else time.monotonic() - start


@pytest.mark.sglang
@pytest.mark.timeout(1200)
def test_a_frozen_then_a_dead_sglang_server_is_detected_and_the_replica_gives_way(
        tmp_path: Path, sglang_server: SGLangServer, servers) -> None:  # noqa: F811
    pid = sglang_server.pid
    assert pid is not None
    with pytest.raises(SGLangError, match="HTTP 401"):
        SGLangClient(sglang_server.url, timeout=10).model_info()         # the server refuses a caller without the key
    assert sglang_server.client(timeout=10).model_info()
    proc, addr = _replica(tmp_path / "a", sglang_server, servers, "rep-frozen")
    try:
        os.killpg(os.getpgid(pid), signal.SIGSTOP)
        try:
            frozen = _seconds_until_replaced(proc, addr)
        finally:
            os.killpg(os.getpgid(pid), signal.SIGCONT)
        assert frozen < DETECT_WITHIN, f"a frozen server took {frozen:.1f}s to detect"
        # The server answers again: a fresh replica turns SERVING against it, then the server dies under it.
        proc, addr = _replica(tmp_path / "b", sglang_server, servers, "rep-dead")
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        dead = _seconds_until_replaced(proc, addr)
        assert dead < DETECT_WITHIN, f"a dead server took {dead:.1f}s to detect"
        print(f"detected: frozen {frozen:.1f}s, dead {dead:.1f}s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
