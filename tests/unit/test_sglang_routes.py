"""R3 with SGLang without a server: the request fields for routes against SGLang 0.5.23's own request types, and
routes that went through SGLang's own capture read-back and encoding decoding to the torch engine's layout
(positions P-1 .. P+T-2, the MoE layers in order). Both SGLang checks run in its venv (subprocess)."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

from rlfleet.protocols import SamplingParams
from rlfleet.services.rollout.engines.base import EngineError
from rlfleet.services.rollout.engines.moe_routes import find_routers
from rlfleet.services.rollout.engines.sglang.client import SGLangClient
from rlfleet.services.rollout.engines.sglang.engine import SGLangEngine
from rlfleet.services.rollout.engines.sglang.protocol import generate_body, parse_generate_response
from rlfleet.services.rollout.engines.sglang.routes import (
    SERVER_FLAG,
    MoeShape,
    decode_routes,
    moe_shape,
    routes_request,
)
from rlfleet.services.rollout.engines.sglang.server import SGLangServerSpec
from tests.support.requires import requires
from tests.support.sglang_stub import INSTALL_HINT, STUB_DIR, make_sglang_tiny_model, sglang_python
from tests.support.tiny_moe import LAYERS, TOP_K, make_tiny_moe

PYTHON = sglang_python()
needs_sglang = requires(None if PYTHON else f"no SGLang venv: {INSTALL_HINT}")
ENV = {"PYTHONPATH": str(STUB_DIR), "SGLANG_USE_CPU_ENGINE": "1"}


def _in_sglang(script: str, payload: dict[str, Any]) -> dict[str, Any]:
    assert PYTHON is not None
    out = subprocess.run([str(PYTHON), str(STUB_DIR / script)], input=json.dumps(payload), capture_output=True,
                         text=True, timeout=300, env=ENV)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.sglang
@needs_sglang
def test_routes_request_fits_sglang_request_types() -> None:
    body = generate_body([1, 5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=4), "r", routes=True)
    assert body["return_routed_experts"] is True and body["routed_experts_start_len"] == 3
    canary = {**body, "return_routed_expert": True}                   # misspelt: the server would drop it
    errors = _in_sglang("contract_check.py", {"requests": [{"path": "/generate", "body": body},
                                                           {"path": "/generate", "body": canary}]})["errors"]
    assert errors and all("'return_routed_expert'" in e for e in errors), errors       # the canary only


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize("moe_layers", [(0, 1, 2), (1, 2)])
def test_sglang_encoded_routes_decode_to_the_positions_that_produce_each_output_token(
        moe_layers: tuple[int, ...]) -> None:
    p, t, layers, k = 5, 4, 3, 2
    start = routes_request(p)["routed_experts_start_len"]
    out = _in_sglang("routes_check.py", {"num_layers": layers, "top_k": k, "prompt_len": p, "n_tokens": t,
                                         "start_len": start, "seed": len(moe_layers)})
    positions = np.array(out["positions"])                            # [P + T, layers, K] per KV position
    shape = MoeShape(num_layers=layers, moe_layers=moe_layers, top_k=k)
    routes = decode_routes(out["meta_info"]["routed_experts"], t, shape)
    np.testing.assert_array_equal(routes, positions[p - 1:p + t - 1][:, list(moe_layers)])
    assert routes.dtype == np.int64
    np.testing.assert_array_equal(np.array(out["sglang_decoded"]).reshape(t, layers, k)[:, list(moe_layers)], routes)
    answer = {"output_ids": [7, 8, 9, 2], "meta_info": {
        "finish_reason": {"type": "stop"}, "routed_experts": out["meta_info"]["routed_experts"],
        "output_token_logprobs": [[-0.5, tok, None] for tok in (7, 8, 9, 2)]}}
    np.testing.assert_array_equal(parse_generate_response(answer, 0, routes=shape).routed_experts, routes)


def _b64(rows: np.ndarray) -> str:
    return base64.b64encode(rows.astype("<i4").tobytes()).decode()


def test_missing_or_misshapen_routes_fail_a_finished_request_not_an_aborted_one() -> None:
    shape = MoeShape(num_layers=2, moe_layers=(0, 1), top_k=2)

    def answer(reason: str, routes: str | None) -> dict[str, Any]:
        meta = {"finish_reason": {"type": reason}, "output_token_logprobs": [[-0.1, 4, None], [-0.2, 5, None]]}
        return {"output_ids": [4, 5], "meta_info": meta if routes is None else {**meta, "routed_experts": routes}}

    with pytest.raises(EngineError, match=SERVER_FLAG):
        parse_generate_response(answer("length", None), 0, routes=shape)
    with pytest.raises(EngineError, match="2 output tokens"):
        parse_generate_response(answer("length", _b64(np.zeros((3, 2, 2)))), 0, routes=shape)
    assert parse_generate_response(answer("abort", None), 0, routes=shape).routed_experts is None
    assert parse_generate_response(answer("length", None), 0).routed_experts is None          # dense: not asked


def test_moe_shape_finds_the_layers_the_torch_engine_records(tmp_path: Path) -> None:
    for arch in ("qwen2_moe", "mixtral"):
        assert moe_shape(make_tiny_moe(tmp_path / arch, arch=arch)) == MoeShape(LAYERS, tuple(range(LAYERS)), TOP_K)
    assert moe_shape(make_sglang_tiny_model(tmp_path / "dense")) is None
    cfg = Qwen2MoeConfig(vocab_size=32, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         shared_expert_intermediate_size=16, intermediate_size=32, decoder_sparse_step=2,
                         mlp_only_layers=[3])
    Qwen2MoeForCausalLM(cfg).save_pretrained(str(tmp_path / "sparse"))
    routers = [name for name, _ in find_routers(Qwen2MoeForCausalLM(cfg))]
    shape = moe_shape(tmp_path / "sparse")
    assert shape is not None and shape.num_layers == 6 and shape.top_k == 2
    assert [f"model.layers.{i}.mlp.gate" for i in shape.moe_layers] == routers == ["model.layers.1.mlp.gate",
                                                                                   "model.layers.5.mlp.gate"]


class _Answering(SGLangClient):
    """Records /generate bodies and answers each with the canned body."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__("http://sglang.invalid", timeout=1.0)
        self.answer = answer
        self.bodies: list[Any] = []

    def _call(self, method: str, path: str, body: Any, timeout: float) -> Any:
        self.bodies.append(body)
        return self.answer


@pytest.mark.parametrize("moe", [True, False])
def test_engine_asks_for_routes_exactly_for_a_moe_model(moe: bool, tmp_path: Path) -> None:
    model = make_tiny_moe(tmp_path / "m") if moe else make_sglang_tiny_model(tmp_path / "m")
    routes: np.ndarray = np.arange(2 * LAYERS * TOP_K).reshape(2, LAYERS, TOP_K) % 8
    meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.1, 4, None], [-0.2, 5, None]],
            "routed_experts": _b64(routes)}
    client = _Answering({"output_ids": [4, 5], "meta_info": meta})
    engine = SGLangEngine(client, model, max_concurrency=1)
    try:
        gen = engine.submit([1, 2, 3], SamplingParams(max_new_tokens=2)).result(timeout=30)
    finally:
        engine.shutdown()
    body = client.bodies[0]
    assert body.get("return_routed_experts", False) is moe
    assert body.get("routed_experts_start_len") == (2 if moe else None)
    if moe:
        np.testing.assert_array_equal(gen.routed_experts, routes)
    else:
        assert gen.routed_experts is None


def test_server_spec_passes_the_flag_only_when_asked(tmp_path: Path) -> None:
    assert SERVER_FLAG in SGLangServerSpec(model_path=tmp_path, return_routed_experts=True).command(30000)
    assert SERVER_FLAG not in SGLangServerSpec(model_path=tmp_path).command(30000)
