"""Start and stop a local SGLang HTTP server (`python -m sglang.launch_server`) as a subprocess, for local runs,
tests and the bench. In production the server is its own container and the engine only gets its URL.

SGLang runs in its own Python environment (scripts/install_sglang_cpu.sh makes .venv-sglang); rlfleet never
imports it. On CPU the server needs SGLANG_USE_CPU_ENGINE=1 and, with 0.5.23 beside the CPU torch, an import
stub for torchvision / sgl_kernel on its PYTHONPATH (tests/support/sglang_stub, passed in as `pythonpath`).

The server's API key never goes on its command line (which every local user reads in /proc/<pid>/cmdline and `ps`):
sglang 0.5.23 has no environment variable for it, so it goes in a YAML file that `--config` names (sglang merges the
file's keys as flags), in a folder of its own made 0700, the file 0600, removed once the server is up (it read the
file at start) or stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet.runtime.ports import free_port
from rlfleet.services.rollout.engines.base import EngineError
from rlfleet.services.rollout.engines.sglang.client import SGLangClient
from rlfleet.services.rollout.engines.sglang.routes import SERVER_FLAG as ROUTES_FLAG

DEFAULT_PYTHON = Path(".venv-sglang/bin/python")



@dataclass(frozen=True)
class SGLangServerSpec:
    model_path: Path
    python: Path = DEFAULT_PYTHON
    host: str = "127.0.0.1"
    port: int = 0                              # 0: a free port
    device: str = "cpu"
    dtype: str = "float32"
    max_total_tokens: int = 4096
    mem_fraction_static: float = 0.1
    max_running_requests: int = 64
    disable_radix_cache: bool = True           # no prefix KV reused across a weight update (see engine.py)
    return_routed_experts: bool = False        # MoE routes for R3 (routes.py): set for a MoE model
    pythonpath: tuple[Path, ...] = ()          # e.g. the CPU import stub folder
    threads: int = 1                           # OMP threads of the server (CPU)
    tp: int = 1                                # tensor parallelism over this many GPUs
    api_key: str = ""                          # every request must carry it ("" = none); passed in a file
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def command(self, port: int, key_config: Path | None = None) -> list[str]:
        """The server's command line; key_config: the file holding the API key (write_key_config), needed when the
        spec has one. The key itself is never on it."""
        if self.api_key and key_config is None:
            raise ValueError("a server with an API key needs its key file (write_key_config), not --api-key")
        cmd = [str(self.python), "-m", "sglang.launch_server", "--model-path", str(self.model_path),
               "--host", self.host, "--port", str(port), "--device", self.device, "--dtype", self.dtype,
               "--max-total-tokens", str(self.max_total_tokens), "--mem-fraction-static", str(self.mem_fraction_static),
               "--max-running-requests", str(self.max_running_requests), "--skip-tokenizer-init",
               "--log-level", "warning"]
        if self.device == "cpu":
            cmd += ["--attention-backend", "torch_native", "--disable-cuda-graph"]
        if self.disable_radix_cache:
            cmd.append("--disable-radix-cache")
        if self.tp > 1:
            cmd += ["--tp-size", str(self.tp)]
        if self.api_key and key_config is not None:
            cmd += ["--config", str(key_config)]
        if self.return_routed_experts:
            cmd.append(ROUTES_FLAG)
        return cmd + list(self.extra_args)


def write_key_config(folder: Path, api_key: str) -> Path:
    """A sglang --config file holding only the API key: 0600 from creation, in `folder` (which should be 0700)."""
    if not api_key or any(c in api_key for c in "\r\n\"'\\"):
        raise ValueError("the SGLang API key must be a non-empty single line without quotes or backslashes")
    path = folder / "sglang-key.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'api-key: "{api_key}"\n')
    return path


class SGLangServer:
    """One server subprocess in its own process group; stop() ends that group (SGLang forks scheduler workers)."""

    def __init__(self, spec: SGLangServerSpec, log_path: Path | None = None) -> None:
        self.spec = spec
        self.port = spec.port or free_port(spec.host)
        self.url = f"http://{spec.host}:{self.port}"
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._key_dir: Path | None = None           # the key file's private folder, until the server has read it

    def start(self, ready_timeout: float = 300.0) -> SGLangServer:
        if not Path(self.spec.python).exists():
            raise EngineError(f"no SGLang python at {self.spec.python}: run scripts/install_sglang_cpu.sh")
        env = dict(os.environ)
        env.update({"OMP_NUM_THREADS": str(self.spec.threads), "MKL_NUM_THREADS": str(self.spec.threads),
                    "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        if self.spec.device == "cpu":
            env["SGLANG_USE_CPU_ENGINE"] = "1"
        if self.spec.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([str(p) for p in self.spec.pythonpath]
                                                + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.update(self.spec.env)
        key_config = None
        if self.spec.api_key:
            self._key_dir = Path(tempfile.mkdtemp(prefix="rlfleet-sglang-key-"))     # 0700
            key_config = write_key_config(self._key_dir, self.spec.api_key)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 - kept by Popen
        try:
            self._proc = subprocess.Popen(self.spec.command(self.port, key_config), env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            self._remove_key_file()
            raise
        finally:
            if not isinstance(out, int):
                out.close()
        self.wait_ready(ready_timeout)
        self._remove_key_file()                     # read at start: no copy of the key stays on disk
        return self

    def _remove_key_file(self) -> None:
        folder, self._key_dir = self._key_dir, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def wait_ready(self, timeout: float) -> None:
        client = self.client(timeout=5.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise EngineError(f"SGLang server exited with {self._proc.returncode} while starting"
                                  f"{f' (log: {self.log_path})' if self.log_path else ''}")
            if client.healthy(timeout=5.0):
                return
            time.sleep(0.5)
        self.stop()
        raise EngineError(f"SGLang server at {self.url} not healthy after {timeout:.0f}s")

    def client(self, **kwargs: float) -> SGLangClient:
        """A client for this server, carrying its API key."""
        return SGLangClient(self.url, api_key=self.spec.api_key, **kwargs)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        self._remove_key_file()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
