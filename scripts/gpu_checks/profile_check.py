"""Device-machine check for trainer.profile and model.specs on CUDA (issue 42 items 6-7), one script.

    python scripts/gpu_checks/profile_check.py [--out /tmp/profile_check]

1. A 3-step run of the addition recipe on a tiny model with trainer.device and rollout.device cuda, profiling step 1
   and carrying the example model spec (examples/model_specs/): the run must finish, and the trainer's and the
   replica's traces must load as JSON and hold CUDA kernel events (cat "kernel") beside the CPU ops.
2. The example spec's logprobs on CUDA in float32: the torch engine with the spec vs the plain HF model.
Prints what it finds; exits non-zero on the first failure. Not run where no GPU was lent (none was while this was
written: both pieces were tested on CPU only, tests/unit/model_specs/, tests/unit/test_torch_profile.py,
tests/e2e/test_profile_run.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _kernels(path: Path) -> int:
    events = json.loads(path.read_text())["traceEvents"]
    return sum(1 for e in events if e.get("cat") == "kernel")


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from rlfleet.config import ModuleSpecConfig
    from rlfleet.model_specs import load_specs
    from rlfleet.protocols import SamplingParams
    from rlfleet.services.rollout.engines.torch_engine import TorchEngine
    from tests.support.runs import failure_report, run_rlfleet
    from tests.support.tiny_model import make_tiny_model

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/profile_check")
    out = Path(p.parse_args().out)
    model = make_tiny_model(out / "tiny")
    spec = {"target": "model.layers.*.mlp", "replace": "examples.model_specs.plain_mlp:PlainMlp"}
    run_dir = out / "run"
    result = run_rlfleet(run_dir, model, {
        "trainer.steps": 3, "trainer.groups_per_step": 2, "rollout.group_size": 4, "rollout.claim_groups": 2,
        "eval.data_source": None, "trainer.device": "cuda", "rollout.device": "cuda", "trainer.precision": "fp32",
        "trainer.profile.steps": [1], "model.specs": [spec]}, timeout=500)
    if result.returncode != 0:
        print(failure_report(result, run_dir))
        return 1
    for name in ("trainer-step-1-rank0.json", "rollout-0-v1.json"):
        kernels = _kernels(run_dir / "profile" / name)
        print(f"{name}: {kernels} CUDA kernel events")
        if not kernels:
            return 1
    engine = TorchEngine(model, device="cuda", dtype="float32", model_specs=load_specs([ModuleSpecConfig(**spec)]))
    try:
        gen = engine.submit([1, 2, 3, 4], SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)).result(60)
    finally:
        engine.shutdown()
    ref = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).to("cuda")
    full = torch.tensor([[1, 2, 3, 4, *gen.output_ids]], device="cuda")
    with torch.no_grad():
        logp = torch.log_softmax(ref(input_ids=full).logits[0].float(), -1)
    want = torch.tensor([float(logp[3 + t, tok]) for t, tok in enumerate(gen.output_ids)])
    gap = float((torch.tensor(gen.logprobs) - want).abs().max())
    print(f"example spec on CUDA: max |engine - HF| logprob {gap:.2e}")
    return 0 if gap < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
