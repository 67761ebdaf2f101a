"""`rlfleet run` of supervised fine-tuning on labelled rows (examples/addition/sft.yaml: the data replica Puts each
row's label as a sample, the trainer's `sft` preset trains on it) and of on-policy distillation from a teacher,
each raising held-out accuracy on the addition task from the shared warm start; a teacher with another vocabulary is
refused before anything starts. The teacher is built here from nothing downloaded: the warm start trained further
in-process (examples/addition/warm_start.py `supervised`), so it adds better than the student."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlfleet.runtime.metrics import read_jsonl
from tests.support.runs import EXAMPLE, ROOT, failure_report, run_rlfleet, summary

pytestmark = pytest.mark.slow

SFT_CONFIG = ROOT / "examples" / "addition" / "sft.yaml"
STEPS = 30
SFT_STEPS = 40             # SFT moved held-out accuracy +4.4 points in 30 steps (distillation +9.0): more margin
TEACHER_STEPS = 300        # in-process supervised steps on top of the warm start (batch 64)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, warm_model: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.addition.data import heldout_prompts
    from examples.addition.warm_start import _encode, exact_match, supervised

    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("teacher") / "model"
    shutil.copytree(warm_model, path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(path))
    supervised(model, tok, TEACHER_STEPS, seed=1)
    model.save_pretrained(str(path), safe_serialization=True)
    split = heldout_prompts(seed=0)
    heldout = _encode(tok, [split[i] for i in range(len(split))])   # the held-out split, teacher-forced greedy
    student = AutoModelForCausalLM.from_pretrained(str(warm_model), dtype=torch.float32)
    assert exact_match(model, tok, heldout) > exact_match(student, tok, heldout) + 0.2   # it adds better
    return path


def _run(tmp_path: Path, model: Path, overrides: dict[str, Any], config: Path = EXAMPLE) -> dict[str, Any]:
    run_dir = tmp_path / "run"
    result = run_rlfleet(run_dir, model, {"eval.every_steps": 0, "trainer.checkpoint_every": STEPS,
                                         "model.prepare": None, **overrides}, config=config)
    assert result.returncode == 0, failure_report(result, run_dir)
    return {"run_dir": run_dir, **summary(run_dir)}


def test_sft_on_labelled_rows_raises_heldout_accuracy(tmp_path: Path, warm_model: Path) -> None:
    s = _run(tmp_path, warm_model, {"trainer.steps": SFT_STEPS, "trainer.checkpoint_every": SFT_STEPS},
             config=SFT_CONFIG)
    assert s["steps"] == SFT_STEPS
    records = [r for r in read_jsonl(s["run_dir"] / "metrics" / "trainer.jsonl") if "loss" in r]
    assert len(records) == SFT_STEPS and all(r["loss"] == pytest.approx(r["nll"]) for r in records)
    assert s["eval_after"] > s["eval_before"] + 0.03, s
    assert (s["run_dir"] / "final" / "config.json").exists()      # the folder the RL run starts from


def test_distillation_from_a_better_teacher_raises_heldout_accuracy(tmp_path: Path, warm_model: Path,
                                                                    teacher: Path) -> None:
    s = _run(tmp_path, warm_model, {"trainer.algorithm": "distill", "trainer.teacher.model_path": str(teacher),
                                    "trainer.steps": STEPS})
    assert s["steps"] == STEPS
    records = [r for r in read_jsonl(s["run_dir"] / "metrics" / "trainer.jsonl") if "loss" in r]
    assert len(records) == STEPS
    assert s["eval_after"] > s["eval_before"] + 0.03, s


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path: Path, warm_model: Path) -> None:
    other = tmp_path / "other_vocab"
    shutil.copytree(warm_model, other)
    table = json.loads((other / "tokenizer.json").read_text())
    vocab = table["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]                # same size, two ids swapped
    (other / "tokenizer.json").write_text(json.dumps(table))
    run_dir = tmp_path / "run"
    result = run_rlfleet(run_dir, warm_model, {"trainer.algorithm": "distill",
                                               "trainer.teacher.model_path": str(other)})
    assert result.returncode != 0
    assert "does not share the student's vocabulary" in result.stderr, result.stderr[-2000:]
    assert "'1': id 5 vs 6" in result.stderr, result.stderr[-2000:]
    assert not (run_dir / "logs").exists()                         # refused before any service started
