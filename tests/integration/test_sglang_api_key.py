"""The SGLang server a replica starts holds its API key without showing it: a real SGLang 0.5.23 server on CPU is
started with a key; no process of its tree has the key on its command line (/proc/<pid>/cmdline, what `ps` shows
every local user), the key file is gone once the server is up, and the server still refuses a request without the
key and answers one with it. Needs .venv-sglang (bash scripts/install_sglang_cpu.sh)."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import psutil
import pytest

from rlfleet.services.rollout.engines.sglang.server import SGLangServer
from tests.support.requires import missing
from tests.support.sglang_stub import INSTALL_HINT, make_sglang_tiny_model, server_spec, sglang_python

PYTHON = sglang_python()


@pytest.mark.sglang
@pytest.mark.timeout(1200)
def test_the_launched_server_has_its_key_but_no_command_line_shows_it(tmp_path: Path) -> None:
    if PYTHON is None:
        missing(f"no SGLang venv: {INSTALL_HINT}")
    key = secrets.token_urlsafe(24)
    model = make_sglang_tiny_model(tmp_path / "model")
    server = SGLangServer(server_spec(model, PYTHON, api_key=key), log_path=tmp_path / "server.log")
    server.start(ready_timeout=900)
    try:
        assert server.pid is not None
        root = psutil.Process(server.pid)
        tree = [root, *root.children(recursive=True)]
        lines = [" ".join(p.cmdline()) for p in tree]
        assert "sglang.launch_server" in lines[0]
        assert not any(key in line for line in lines), "the API key is on a command line"
        assert not any("--api-key" in line for line in lines)
        args = root.cmdline()
        assert not Path(args[args.index("--config") + 1]).exists(), "the key file outlived the start"
        assert httpx.get(f"{server.url}/get_model_info", timeout=30).status_code == 401
        ok = httpx.get(f"{server.url}/get_model_info", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert ok.status_code == 200, ok.text
    finally:
        server.stop()
