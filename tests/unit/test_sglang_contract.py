"""The SGLang engine's HTTP contract, checked against SGLang 0.5.23's own request/response types (in its venv), and
the engine's handling of answers and refusals without a server."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from rlfleet.protocols import SamplingParams
from rlfleet.services.rollout.engines.base import EngineError
from rlfleet.services.rollout.engines.sglang.client import SGLangClient, SGLangError
from rlfleet.services.rollout.engines.sglang.engine import SGLangEngine
from rlfleet.services.rollout.engines.sglang.protocol import generate_body, parse_generate_response, sampling_body
from tests.support.requires import requires
from tests.support.sglang_stub import INSTALL_HINT, STUB_DIR, make_sglang_tiny_model, sglang_python


class RecordingClient(SGLangClient):
    """Records every call's path and JSON body; answers like a server that accepts everything."""

    def __init__(self) -> None:
        super().__init__("http://sglang.invalid", timeout=1.0)
        self.calls: list[dict[str, Any]] = []
        self.timeouts: list[float] = []

    def _call(self, method: str, path: str, body: Any, timeout: float) -> Any:
        self.calls.append({"path": path, "body": body})
        self.timeouts.append(timeout)
        return {"success": True, "message": "ok"}


def _every_call(client: SGLangClient) -> None:
    client.begin_weight_update()
    client.update_weights_from_disk("/tmp/w/v3", "3", flush_cache=False)
    client.init_weights_update_group("127.0.0.1", 29555, 1, 2, "rlfleet-g")
    client.update_weights_from_distributed(["model.norm.weight"], ["float32"], [[128]], "rlfleet-g", "4",
                                           flush_cache=True)
    client.end_weight_update()
    client.destroy_weights_update_group("rlfleet-g")
    client.pause_generation("in_place")
    client.continue_generation()
    client.abort("rid-1")
    client.abort(abort_all=True)
    client.get_weights_by_name("model.norm.weight", truncate_size=128)
    client.flush_cache()


def _generate_bodies() -> list[dict[str, Any]]:
    return [generate_body([1, 5, 6], SamplingParams(temperature=0.0, max_new_tokens=4), "greedy"),
            generate_body([1, 5], SamplingParams(temperature=0.8, top_p=0.9, top_k=5, max_new_tokens=8,
                                                 stop_token_ids=(2, 3), seed=11), "sampled")]


# ---- against SGLang's own types (the SGLang venv) -------------------------------------------------------------------

PYTHON = sglang_python()
CANARIES = [  # wrong on purpose: the check must catch a misspelt key, a key the server drops and a bad sampling key
    {"path": "/update_weights_from_disk", "body": {"model_path": "/w", "weight_versoin": "1"}},
    {"path": "/generate", "body": {"input_ids": [1], "sampling_params": {"seed": 3}}},
]
needs_sglang = requires(None if PYTHON else f"no SGLang venv: {INSTALL_HINT}")


@pytest.fixture(scope="module")
def sglang_check() -> dict[str, Any]:
    client = RecordingClient()
    _every_call(client)
    requests = [{"path": "/generate", "body": b} for b in _generate_bodies()] + client.calls + CANARIES
    out = subprocess.run([str(PYTHON), str(STUB_DIR / "contract_check.py")], input=json.dumps({"requests": requests}),
                         capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(STUB_DIR),
                                                                           "SGLANG_USE_CPU_ENGINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.sglang
@needs_sglang
def test_request_bodies_fit_sglang_request_types(sglang_check: dict[str, Any]) -> None:
    errors = sglang_check["errors"]
    canaries = [e for e in errors if "weight_versoin" in e or "`seed`" in e]
    assert len(canaries) == 2, errors               # the check works
    assert [e for e in errors if e not in canaries] == []


@pytest.mark.sglang
@needs_sglang
def test_answers_built_with_sglang_types_parse_exactly(sglang_check: dict[str, Any]) -> None:
    answers = sglang_check["answers"]
    stop = parse_generate_response(answers["stop"], fallback_version=0)
    assert (stop.output_ids, stop.finish_reason, stop.token_versions) == ((5, 6, 2), "stop", (3, 3, 3))
    assert stop.logprobs == (-0.25, -0.5, -0.75)
    length = parse_generate_response(answers["length"], fallback_version=0)
    assert (length.finish_reason, length.token_versions, length.weight_version) == ("length", (3, 3, 4, 4), 3)
    abort = parse_generate_response(answers["abort"], fallback_version=7)
    assert (abort.finish_reason, abort.output_ids, abort.token_versions) == ("abort", (11,), (7,))


# ---- without a server ------------------------------------------------------------------------------------------------

def test_every_call_has_a_timeout() -> None:
    client = RecordingClient()
    _every_call(client)
    client.generate(_generate_bodies()[0])
    assert len(client.timeouts) == len(client.calls) and all(0 < t < float("inf") for t in client.timeouts)


def test_sampling_maps_to_sglang_names() -> None:
    body = sampling_body(SamplingParams(temperature=0.0, top_k=0, max_new_tokens=3, seed=5))
    assert body["top_k"] == -1 and body["sampling_seed"] == 5 and "stop_token_ids" not in body
    assert generate_body([1], SamplingParams(), "r")["return_logprob"] is True


def test_answer_with_mismatched_logprobs_is_refused() -> None:
    bad = {"output_ids": [4, 5], "meta_info": {"finish_reason": {"type": "length"},
                                                "output_token_logprobs": [[-0.1, 4, None], [-0.2, 6, None]]}}
    with pytest.raises(EngineError, match="token 6"):
        parse_generate_response(bad, 0)
    with pytest.raises(EngineError, match="meta_info"):
        parse_generate_response({"error": "x"}, 0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sglang_tiny_model(tmp_path_factory.mktemp("sgl-tiny") / "model")


def test_update_is_refused_before_the_server_sees_it(tiny: Path) -> None:
    client = RecordingClient()
    engine = SGLangEngine(client, tiny, max_concurrency=1)
    try:
        with pytest.raises(EngineError, match="unknown tensor"):
            engine.update_weights_from_tensor([("model.nope", torch.zeros(2))], 1)
        with pytest.raises(EngineError, match="shape"):
            engine.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))], 1)
        assert client.calls == [] and engine.weight_version == 0
        engine.update_weights_from_tensor([("model.norm.weight", torch.ones(128))], 2)
        paths = [c["path"] for c in client.calls]
        assert paths == ["/begin_weight_update", "/update_weights_from_disk", "/end_weight_update"]
        folder = Path(client.calls[1]["body"]["model_path"])
        assert (folder / "model.safetensors").exists() and (folder / "config.json").exists()
        assert engine.weight_version == 2
    finally:
        engine.shutdown()


class _Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server API
        body = json.dumps({"success": False, "message": "no session"}).encode()
        self.send_response(400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def test_refusal_and_unreachable_server_raise_sglang_error() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SGLangError, match="HTTP 400.*no session"):
            SGLangClient(f"http://127.0.0.1:{server.server_port}", timeout=5).begin_weight_update()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(SGLangError):
        SGLangClient(f"http://127.0.0.1:{server.server_port}", timeout=2).model_info()
    assert not SGLangClient(f"http://127.0.0.1:{server.server_port}", timeout=2).healthy(timeout=1)


def test_config_engine_sglang_uses_the_given_server(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlfleet.config import load_config
    from rlfleet.services.rollout.engines import make_engine

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples/addition/config.yaml",
                      {"rollout.engine": "sglang", "model.path": str(tiny), "rollout.max_batch_size": 3,
                       "rollout.sglang.weights": "distributed", "rollout.sglang.url": "http://127.0.0.1:7"})
    monkeypatch.setenv("RLFLEET_SGLANG_URL", "http://127.0.0.1:9")      # the machine's override wins
    engine = make_engine(cfg)
    try:
        assert isinstance(engine, SGLangEngine) and engine.weight_path == "distributed"
        assert engine.client.base_url == "http://127.0.0.1:9" and not engine.healthy()
    finally:
        engine.shutdown()


@needs_sglang
def test_stub_is_pinned_and_refuses_calls() -> None:
    code = ("import sgl_kernel, torchvision.transforms as T\n"
            "from sgl_kernel import silu_and_mul\n"
            "class C(T.Compose): pass\n"
            "try:\n    silu_and_mul(1)\nexcept RuntimeError as e:\n    print('refused:', e)\n")
    out = subprocess.run([str(PYTHON), "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(STUB_DIR)})
    assert out.returncode == 0 and "refused: sgl_kernel.silu_and_mul is a test-only stub" in out.stdout, out.stderr


def test_verify_sent_answers_the_last_update_without_reading_back(tiny: Path) -> None:
    from tests.support.sglang_stub import tiny_llama_state

    client = RecordingClient()
    engine = SGLangEngine(client, tiny, max_concurrency=1, verify="sent")
    try:
        _, state = tiny_llama_state(5)
        engine.update_weights_from_tensor(list(state.items()), 1)
        client.calls.clear()
        held = dict(engine.named_weights())
        assert client.calls == []                                   # nothing read back: every name was sent
        assert held.keys() == state.keys() and all(torch.equal(held[n], t) for n, t in state.items())
    finally:
        engine.shutdown()


def test_server_command_carries_tp_and_the_api_key_file_but_never_the_key(tiny: Path, tmp_path: Path) -> None:
    import yaml

    from rlfleet.services.rollout.engines.sglang.server import SGLangServerSpec, write_key_config

    spec = SGLangServerSpec(model_path=tiny, device="cuda", tp=8, api_key="k123-secret", mem_fraction_static=0.85,
                            max_total_tokens=200000)
    key_file = write_key_config(tmp_path, spec.api_key)
    cmd = spec.command(30000, key_file)
    assert cmd[cmd.index("--tp-size") + 1] == "8" and cmd[cmd.index("--config") + 1] == str(key_file)
    assert not any("k123-secret" in arg for arg in cmd) and "--api-key" not in cmd
    assert yaml.safe_load(key_file.read_text()) == {"api-key": "k123-secret"}
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert cmd[cmd.index("--mem-fraction-static") + 1] == "0.85"
    assert cmd[cmd.index("--max-total-tokens") + 1] == "200000"
    with pytest.raises(ValueError, match="key file"):
        spec.command(30000)                                    # never falls back to --api-key
    plain = SGLangServerSpec(model_path=tiny).command(30000)
    assert "--tp-size" not in plain and "--config" not in plain
