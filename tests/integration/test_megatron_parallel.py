"""The Megatron-core backend over gloo (behind the test-only CPU shims) trains like the FSDP backend on 1 process:
same losses and metrics, same updated weights under their HF names, for TP=2, DP=2 and PP=2 (tied embedding split
over the stages, 2 pipelined microbatches); a checkpoint resumes bit-identically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rlfleet.services.trainer import checkpoint
from tests.support.megatron_cpu_shims import megatron_skip_reason
from tests.support.megatron_runs import make_tiny_qwen2, spawn_run
from tests.support.requires import requires
from tests.support.tiny_model import make_tiny_model

SKIP = megatron_skip_reason()
pytestmark = requires(SKIP)

VOCAB = 19            # not a multiple of 2: TP=2 pads the vocabulary
METRIC_TOL = 1e-5     # fp32 on CPU: reductions in another order
WEIGHT_TOL = 1e-5


def _assert_same_training(reference: dict[str, Any], run: dict[str, Any], world: int) -> None:
    fsdp_only = {"entropy"}                                    # the Megatron backend reports no entropy (yet)
    for a, b in zip(reference["rank0"]["records"], run["rank0"]["records"], strict=True):
        assert a.keys() - fsdp_only == b.keys() - fsdp_only
        for key in a.keys() & b.keys():
            assert b[key] == pytest.approx(a[key], abs=METRIC_TOL), key
    for r in range(1, world):                                  # every rank reports the global metrics
        assert run[f"rank{r}"]["records"] == run["rank0"]["records"]
    for r in range(world):                                     # and left its groups: none of their threads is left
        assert run[f"threads{r}"] == [], f"rank {r} still runs {run[f'threads{r}']} after leaving"
    assert run["order"] == reference["order"]                  # HF names in HF order, as FSDP publishes
    for name, w in reference["weights"].items():
        assert run["weights"][name].dtype == w.dtype
        torch.testing.assert_close(run["weights"][name], w, atol=WEIGHT_TOL, rtol=0, msg=name)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A tiny Qwen2 (GQA, QKV bias, untied) and the FSDP backend's 2 steps on it with 1 process."""
    root = tmp_path_factory.mktemp("qwen2")
    model_dir = make_tiny_qwen2(root / "model", vocab=VOCAB)
    return model_dir, spawn_run(root / "fsdp", model_dir, "fsdp", 1, VOCAB, steps=2)


@pytest.mark.timeout(600)
def test_tensor_parallel_2_equals_fsdp_and_resumes_exactly(qwen2: tuple[Path, dict[str, Any]],
                                                           tmp_path: Path) -> None:
    model_dir, reference = qwen2
    run = spawn_run(tmp_path / "tp2", model_dir, "megatron", 2, VOCAB, steps=2, tp=2, checkpoint_at=0)
    _assert_same_training(reference, run, 2)
    initial = load_file(str(model_dir / "model.safetensors"))
    assert any(not torch.equal(initial[k], run["weights"][k]) for k in initial)      # it did train

    info = checkpoint.latest(tmp_path / "tp2" / "run")
    assert info is not None and (info.step, info.version, info.world_size) == (0, 1, 2)
    checkpoint.verify(info.path)
    for name, w in run["weights"].items():                     # resumed after step 0: bit-identical
        assert torch.equal(run["resumed"][name], w), name
    for r in (0, 1):
        assert run[f"rank{r}"]["resumed_records"] == run[f"rank{r}"]["records"][1:]


@pytest.mark.timeout(600)
def test_data_parallel_2_equals_fsdp(qwen2: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    model_dir, reference = qwen2
    _assert_same_training(reference, spawn_run(tmp_path / "dp2", model_dir, "megatron", 2, VOCAB, steps=2), 2)


@pytest.mark.timeout(600)
def test_pipeline_parallel_2_with_tied_embeddings_equals_fsdp(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "llama")               # tied embeddings, 2 layers: one per stage
    reference = spawn_run(tmp_path / "fsdp", model_dir, "fsdp", 1, VOCAB, steps=2)
    run = spawn_run(tmp_path / "pp2", model_dir, "megatron", 2, VOCAB, steps=2, pp=2, microbatches=2)
    _assert_same_training(reference, run, 2)
