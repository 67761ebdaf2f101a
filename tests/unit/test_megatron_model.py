"""The GPTModel built from an HF config computes HF's logits (CPU fp32, to 1e-4), its vocab-parallel logprobs equal
the trainer's, the backend made by the factory publishes the HF weights unchanged before training, and the GPU check
script runs its CPU-sized path (both backends, same loss)."""

from __future__ import annotations

import importlib.util
import py_compile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlfleet.services.trainer.distributed_exit import leave_distributed
from tests.support.megatron_cpu_shims import megatron_on_cpu, megatron_skip_reason
from tests.support.megatron_runs import make_tiny_qwen2, run_config
from tests.support.requires import requires
from tests.support.tiny_model import make_tiny_model

SKIP = megatron_skip_reason()
pytestmark = requires(SKIP)

LOGIT_TOL = 1e-4


@pytest.fixture(scope="module")
def megatron_world() -> Iterator[None]:
    """One gloo process (this one) with megatron-core's groups, behind the CPU shims."""
    from megatron.core import parallel_state

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with megatron_on_cpu():
            parallel_state.initialize_model_parallel(1, 1)
            yield
            parallel_state.destroy_model_parallel()
    finally:
        leave_distributed()


def _hf_and_megatron(model_dir: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    from rlfleet.services.trainer.backends.megatron.convert import Layout, hf_to_megatron
    from rlfleet.services.trainer.backends.megatron.model import build_gpt_model, model_shape, transformer_config

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    shape = model_shape(hf.config)
    model = build_gpt_model(shape, transformer_config(shape, 1, 1, torch.device("cpu")), True, True)
    model.load_state_dict(hf_to_megatron(shape, hf.state_dict(), Layout()), strict=True)
    return hf, model.eval()


@pytest.mark.parametrize("kind", ["qwen2_untied_gqa_bias", "llama_tied"])
def test_logits_equal_hf(megatron_world: None, tmp_path: Path, kind: str) -> None:
    model_dir = make_tiny_qwen2(tmp_path / "m") if kind.startswith("qwen2") else make_tiny_model(tmp_path / "m")
    hf, model = _hf_and_megatron(model_dir)
    ids = torch.randint(3, 19, (3, 11), generator=torch.Generator().manual_seed(1))           # [B, L]
    positions = torch.arange(11)[None, :].expand(3, -1)
    with torch.no_grad():
        ours = model(ids, positions, None)                                                    # [B, L, V]
        ref = hf(input_ids=ids).logits                                                        # [B, L, V]
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=LOGIT_TOL, rtol=0)


def test_vocab_parallel_logprobs_equal_trainer_logprobs(megatron_world: None) -> None:
    from rlfleet.sample import Sample
    from rlfleet.services.trainer.backends.megatron.logprobs import parallel_response_logprobs
    from rlfleet.services.trainer.batch import build_train_batch, response_logprobs

    samples = [Sample(group_id="g", index=i, group_size=2, prompt_ids=[1, 4, 5][:2 + i], response_ids=[6, 7, 8][i:],
                      rollout_logprobs=[-1.0] * (3 - i), loss_mask=[1] * (3 - i), reward=0.0) for i in range(2)]
    batch = build_train_batch(samples)
    logits = torch.randn(2, batch.input_ids.shape[1], 19, requires_grad=True)                  # [S, L, V]
    ours = parallel_response_logprobs(logits, batch, 0.7, vocab_size=19, vocab_start=0)
    ref = response_logprobs(logits, batch, 0.7)
    mask = batch.response_mask > 0
    torch.testing.assert_close(ours[mask], ref[mask], atol=1e-6, rtol=0)
    (g_ours,) = torch.autograd.grad(ours[mask].sum(), logits)
    (g_ref,) = torch.autograd.grad(ref[mask].sum(), logits)
    torch.testing.assert_close(g_ours, g_ref, atol=1e-6, rtol=0)


def test_factory_backend_publishes_the_hf_weights(megatron_world: None, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from rlfleet.services.trainer.backends import make_backend

    model_dir = make_tiny_qwen2(tmp_path / "m")
    cfg = run_config(tmp_path / "run", model_dir, "megatron", 1)
    backend = make_backend(cfg, 0, 1, torch.device("cpu"))
    assert type(backend).__name__ == "MegatronBackend"
    assert (backend.data_rank, backend.data_world) == (0, 1)
    state = backend.full_state_dict()
    initial = load_file(str(model_dir / "model.safetensors"))
    assert set(state) == set(initial) | {"lm_head.weight"}
    for name, tensor in initial.items():
        assert torch.equal(state[name], tensor), name


GPU_CHECK = Path(__file__).resolve().parents[2] / "scripts" / "gpu_checks" / "megatron_check.py"


def test_gpu_check_script_dry_run_on_cpu(megatron_world: None, tmp_path: Path) -> None:
    py_compile.compile(str(GPU_CHECK), doraise=True)
    spec = importlib.util.spec_from_file_location("megatron_check", GPU_CHECK)
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    results = check.main(["--tiny", "--device", "cpu", "--seq", "12", "--groups", "2", "--steps", "1", "--warmup",
                          "0", "--workdir", str(tmp_path)])
    assert [r["backend"] for r in results] == ["megatron", "fsdp"]
    assert all(r["tokens_per_s"] > 0 and r["mfu"] > 0 for r in results)
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-6)
    assert check.model_flops_per_token(check.QWEN2_05B, 2048) == pytest.approx(2 * 494e6, rel=0.2)   # ~0.5B
