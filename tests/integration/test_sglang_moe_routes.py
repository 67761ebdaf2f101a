"""R3 with SGLang: a real SGLang 0.5.23 server on CPU (float32, tiny Mixtral, --enable-return-routed-experts) records
the same experts, at the same positions, as the built-in torch engine on the same weights.

Must show: greedy token ids equal on both engines and, for every output token, the expert ids of every MoE layer
equal as a set (each engine lists a token's top-k in its own order; the trainer's replay gathers by id, so the order
does not matter), in the torch engine's layout [T, layers, K]. Needs .venv-sglang (scripts/install_sglang_cpu.sh);
the stub folder's CPU allocation fix (tests/support/sglang_stub/sglang_cpu_host_alloc.py) lets the server start.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rlfleet.protocols import Generation, SamplingParams
from rlfleet.services.rollout.engines.sglang.client import SGLangClient
from rlfleet.services.rollout.engines.sglang.engine import SGLangEngine
from rlfleet.services.rollout.engines.sglang.server import SGLangServer
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from tests.support.requires import requires
from tests.support.sglang_stub import INSTALL_HINT, make_sglang_tiny_moe, server_spec, sglang_python

PYTHON = sglang_python()
pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900),
              requires(None if PYTHON else f"no SGLang venv: {INSTALL_HINT}")]

PROMPTS = [[1, 5, 6, 14, 7], [1, 9, 9, 9], [3, 4, 15, 4, 16, 20, 31], [1, 12, 10, 13, 11, 14, 8, 5, 27]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Generation], list[Generation]]]:
    root = tmp_path_factory.mktemp("sglang-moe")
    model = make_sglang_tiny_moe(root / "model")
    assert PYTHON is not None
    server = SGLangServer(server_spec(model, PYTHON, return_routed_experts=True), log_path=root / "server.log")
    server.start(ready_timeout=600)
    sgl = SGLangEngine(SGLangClient(server.url, generate_timeout=300), model, max_concurrency=4, server=server)
    built_in = TorchEngine(model, dtype="float32", max_batch_size=4)
    try:
        ours = [f.result(timeout=300) for f in [built_in.submit(p, GREEDY) for p in PROMPTS]]
        theirs = [f.result(timeout=300) for f in [sgl.submit(p, GREEDY) for p in PROMPTS]]
        yield ours, theirs
    finally:
        built_in.shutdown()
        sgl.shutdown()


def test_sglang_routes_equal_the_torch_engines_token_by_token(
        both: tuple[list[Generation], list[Generation]]) -> None:
    ours, theirs = both
    for prompt, a, b in zip(PROMPTS, ours, theirs, strict=True):
        assert b.output_ids == a.output_ids, f"prompt {prompt}: torch {a.output_ids} sglang {b.output_ids}"
        assert a.routed_experts is not None and b.routed_experts is not None
        assert b.routed_experts.shape == a.routed_experts.shape == (len(a.output_ids), 2, 2)
        assert b.routed_experts.dtype == a.routed_experts.dtype
        np.testing.assert_array_equal(np.sort(b.routed_experts, axis=-1), np.sort(a.routed_experts, axis=-1),
                                      err_msg=f"prompt {prompt}")


def test_routes_differ_across_tokens_so_the_comparison_can_fail(
        both: tuple[list[Generation], list[Generation]]) -> None:
    """An off-by-one position or a layer swap would be caught: the routes vary along tokens and layers."""
    routes = np.concatenate([np.sort(g.routed_experts, axis=-1) for g in both[1]])          # [sum T, 2, 2]
    assert len({r.tobytes() for r in routes[:, 0]}) > 3 and len({r.tobytes() for r in routes[:, 1]}) > 3
    assert (routes[:, 0] != routes[:, 1]).any(axis=-1).mean() > 0.5
    shifted = sum((np.sort(g.routed_experts, axis=-1)[1:] != np.sort(g.routed_experts, axis=-1)[:-1]).any()
                  for g in both[1])
    assert shifted == len(PROMPTS)
