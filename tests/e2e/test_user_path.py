"""A run configured the way a new user would: a JSONL dataset by path, a reward taking a dataset column, a stock
reward for evaluation, TensorBoard and an offline W&B run read back by their own readers, a reward that hangs
(its samples FAILED, the run goes on), and checkpoints and final/ loadable with AutoModelForCausalLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.runs import failure_report, run_rlfleet, summary
from tests.support.tiny_model import make_tiny_model
from tests.support.wandb_records import history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_dataset_file_dashboards_hanging_reward_and_final_model(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "tiny")
    rows = [{"question": f"{a}+{a + 1}=", "answer": str(2 * a + 1), "kind": "hang" if a % 3 == 0 else "plain"}
            for a in range(10, 34)]
    (tmp_path / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "userpath", "seed": 3},
        "model": {"path": "m"},
        "rollout": {"data": {"path": str(tmp_path / "problems.jsonl"), "prompt_field": "question",
                             "label_field": "answer", "chat": False, "holdout": 4},
                    "reward_fn": "tests.support.kind_reward:odd_first_digit", "reward_timeout": 0.5,
                    "group_size": 4, "sampling": {"max_new_tokens": 3}, "claim_groups": 4},
        "trainer": {"steps": 3, "groups_per_step": 4, "lr": 1e-2, "checkpoint_every": 2},
        "eval": {"reward_fn": "regex", "reward_args": {"pattern": "^[13579]"}, "every_steps": 2},
        "dashboards": {"tensorboard": True, "wandb": "offline", "wandb_project": "userpath"},
    }))
    run_dir = tmp_path / "run"
    result = run_rlfleet(run_dir, model, {}, config=config, timeout=500)
    assert result.returncode == 0, failure_report(result, run_dir)
    s = summary(run_dir)
    assert s["steps"] == 3
    assert "eval@3" in result.stderr                     # the progress line shows the latest evaluation
    assert set(s["windows"]) >= {"reward_mean", "truncation_rate", "equal_reward_groups"}
    # the hanging reward failed its samples with the reason, and the run went on
    assert s["buffer"]["dropped"].get("failed", 0) >= 1, s["buffer"]
    assert "reward_fn timed out after 0.5s" in (run_dir / "logs" / "rollout-0.log").read_text()

    records = [json.loads(line) for line in (run_dir / "metrics" / "trainer.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    for key in ("reward_mean", "reward_std", "response_length_mean", "response_length_max", "truncation_rate",
                "equal_reward_groups", "entropy_estimate", "tis_weight_mean", "samples_per_s", "tokens_per_s"):
        assert key in steps[-1], key
    assert all(r["response_length_max"] <= 3 for r in steps)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward_mean")] == [0, 1, 2]
    assert [round(e.value, 5) for e in acc.Scalars("train/reward_mean")] == \
        [round(r["reward_mean"], 5) for r in steps]
    assert [e.step for e in acc.Scalars("eval/reward_mean")] == [0, 2, 3]

    wandb_file = next((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    rows = history(wandb_file)
    by_step = {int(r["_step"]): r for r in rows}
    assert sorted(by_step) == [0, 1, 2, 3]
    assert [float(by_step[i]["train/truncation_rate"]) for i in range(3)] == \
        pytest.approx([r["truncation_rate"] for r in steps])
    assert "eval/pass_rate" in by_step[3]

    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(str(run_dir / "final"))
    first, last = sorted((run_dir / "checkpoints").glob("step_*"))         # step 1 and step 2 (the last)
    last_ckpt = AutoModelForCausalLM.from_pretrained(str(last / "hf"))
    first_ckpt = AutoModelForCausalLM.from_pretrained(str(first / "hf"))
    start = AutoModelForCausalLM.from_pretrained(str(model))
    for name, p in final.state_dict().items():
        assert torch.equal(p, last_ckpt.state_dict()[name]), name
    assert any(not torch.equal(p, start.state_dict()[n]) for n, p in first_ckpt.state_dict().items())
    assert (run_dir / "final" / "tokenizer_config.json").is_file()
