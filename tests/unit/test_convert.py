"""`rlfleet convert`: a trainer checkpoint (here with LoRA adapters and a cosine schedule) becomes an HF folder whose
model computes exactly what the trainer's policy computes; the checkpoint keeps scheduler state and committed ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlfleet.cli import main
from rlfleet.config import parse_config
from rlfleet.runtime.ports import free_ports
from rlfleet.sample import Sample
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.trainer.step import StepContext
from tests.support.ranks import spawn_ranks
from tests.support.tiny_model import make_tiny_model

IDS = [[1, 5, 14, 5, 15, 6, 2], [1, 7, 14, 8, 15, 3, 4]]


def _groups(step: int) -> list[list[Sample]]:
    out = []
    for g in range(2):
        out.append([Sample(group_id=f"s{step}g{g}", index=i, group_size=2, prompt_ids=[1, 5 + g, 14, 5],
                           response_ids=[15, 6 + i, 2], rollout_logprobs=[-2.0, -2.5, -3.0], reward=float(i))
                    for i in range(2)])
    return out


def _worker(rank: int, port: int, run_dir: str, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    cfg = parse_config({
        "run": {"dir": run_dir}, "model": {"path": model_dir},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2},
        "trainer": {"groups_per_step": 2, "lr": 1e-2, "steps": 4, "lora": {"rank": 4, "alpha": 8.0},
                    "scheduler": {"kind": "cosine", "warmup_steps": 2}},
    })
    device = torch.device("cpu")
    init_distributed(f"127.0.0.1:{port}", 0, 1, device)
    try:
        backend = FsdpBackend(cfg, 0, 1, device)
        adv, loss = resolve(cfg.trainer)
        ctx = StepContext(adv, loss, (), temperature=1.0, minibatches=1, grad_clip=1.0, world_size=1, device=device,
                          pad_id=backend.pad_id)
        lrs = [backend.train_step(_groups(s), s, ctx)["lr"] for s in range(2)]
        path = backend.save_checkpoint(Path(run_dir), 1, 2, keep=2)
        with torch.no_grad():
            logits = backend.model(input_ids=torch.tensor(IDS)).logits
        torch.save({"logits": logits.detach().clone()}, Path(out) / "logits.pt")
        published = backend.full_state_dict()
        Path(out, "info.json").write_text(json.dumps({"lrs": lrs, "path": str(path), "published": sorted(published),
                                                      "adapter": backend.adapter_options}))
    finally:
        leave_distributed()



@pytest.mark.timeout(300)
def test_checkpoint_converts_to_an_hf_folder(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = make_tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    out.mkdir()
    spawn_ranks(_worker, (free_ports(1)[0], str(tmp_path / "run"), str(model_dir), str(out)), 1)
    info = json.loads((out / "info.json").read_text())
    assert info["lrs"] == pytest.approx([1e-2 * 0.5, 1e-2])                          # warmup, then the peak
    assert info["published"] and all(".lora_" in n for n in info["published"])       # adapters only
    assert info["adapter"] == {"rank": "4", "alpha": "8.0", "targets": "q_proj,k_proj,v_proj,o_proj"}

    ckpt = Path(info["path"])
    meta = checkpoint.read_meta(ckpt)
    assert meta["lora"]["rank"] == 4 and meta["step"] == 1
    sched = json.loads((ckpt / "scheduler.json").read_text())
    assert sched["last_epoch"] == 2
    assert sorted(checkpoint.committed_sample_ids(ckpt)) == sorted(s.sample_id for st in (0, 1)
                                                                   for g in _groups(st) for s in g)
    hf = tmp_path / "hf"
    assert main(["convert", str(ckpt), str(hf)]) == 0
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    assert not any(".lora_" in n for n in model.state_dict())
    with torch.no_grad():
        got = model(input_ids=torch.tensor(IDS)).logits
    expected = torch.load(out / "logits.pt", weights_only=True)["logits"]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        assert (base(input_ids=torch.tensor(IDS)).logits - got).abs().max() > 1e-4     # the adapters trained
    assert main(["convert", str(tmp_path), str(tmp_path / "bad")]) == 2
