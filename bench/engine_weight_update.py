"""Time from "weights published" to "every replica serving the new version": SGLang engine vs built-in engine, same run.

    python bench/engine_weight_update.py [--replicas 2] [--rounds 2] [--hidden 256] [--layers 4]

Both sides get the same published versions through the real bucketed transport (BucketedSender stages a version =
"published"; its manifest goes to every replica). Each replica runs the production path, WeightUpdater.apply: fetch
over gRPC, check every tensor's hash, pause, load into the engine, resume, read the engine's weights back and check
the digest. The clock stops when the last replica of the group has acknowledged ok. Replicas are idle (no traffic).
Built-in: TorchEngine in this process. SGLang: one real SGLang 0.5.23 server per replica (CPU, float32, needs
.venv-sglang: bash scripts/install_sglang_cpu.sh), loaded via update_weights_from_disk and via
update_weights_from_distributed (gloo), each with the acknowledged digest from a read-back of every tensor
(verify read_back) and from the tensors sent (verify sent), in turn. Prints medians and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.addition.model import tiny_llama_config  # noqa: E402
from examples.addition.tokenizer import save_tokenizer  # noqa: E402
from rlfleet.services.rollout.engines.base import Engine  # noqa: E402
from rlfleet.services.rollout.engines.sglang.client import SGLangClient  # noqa: E402
from rlfleet.services.rollout.engines.sglang.engine import SGLangEngine, Verify, WeightPath  # noqa: E402
from rlfleet.services.rollout.engines.sglang.server import SGLangServer  # noqa: E402
from rlfleet.services.rollout.engines.torch_engine import TorchEngine  # noqa: E402
from rlfleet.services.rollout.weight_updates import WeightUpdater  # noqa: E402
from rlfleet.services.weight_sync.transports.bucketed import BucketedSender  # noqa: E402
from rlfleet.v1 import weights_pb2  # noqa: E402
from tests.support.sglang_stub import INSTALL_HINT, server_spec, sglang_python  # noqa: E402

TOKEN = "bench-token"


def model_state(hidden: int, layers: int, seed: int, vocab: int) -> tuple[object, dict[str, torch.Tensor]]:
    from transformers import LlamaForCausalLM

    cfg = tiny_llama_config(vocab, hidden=hidden, layers=layers, heads=hidden // 64)   # head_dim 64 (SGLang CPU)
    cfg.max_position_embeddings = 256
    torch.manual_seed(seed)
    return cfg, LlamaForCausalLM(cfg).state_dict()


def write_model(path: Path, hidden: int, layers: int) -> Path:
    from transformers import LlamaForCausalLM

    tok = save_tokenizer(path)
    cfg, state = model_state(hidden, layers, 0, len(tok))
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(state)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def publish_to_all(updaters: list[WeightUpdater], manifest: weights_pb2.WeightManifest) -> tuple[float, list[float]]:
    """Seconds until every replica acknowledged ok (and each replica's own seconds)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(updaters)) as pool:
        results = list(pool.map(lambda u: u.apply(manifest), updaters))
    total = time.perf_counter() - t0
    bad = [r for r in results if not r.ok or r.digest != manifest.digest]
    if bad:
        raise RuntimeError(f"replica failed version {manifest.version}: {bad[0].error}")
    return total, [r.seconds for r in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="versions per SGLang weight path and verify mode")
    ap.add_argument("--hidden", type=int, default=256, help="multiple of 64")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ready-timeout", type=float, default=900.0)
    args = ap.parse_args()
    python = sglang_python()
    if python is None:
        sys.exit(f"no SGLang venv: {INSTALL_HINT}")
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-engine-update-"))
    model = write_model(work / "model", args.hidden, args.layers)
    vocab = 19                                   # the addition tokenizer
    t0 = time.perf_counter()
    servers = [SGLangServer(server_spec(model, python), log_path=work / f"sglang-{i}.log")
               for i in range(args.replicas)]
    with ThreadPoolExecutor(args.replicas) as pool:
        list(pool.map(lambda s: s.start(ready_timeout=args.ready_timeout), servers))
    print(f"{args.replicas} SGLang servers up in {time.perf_counter() - t0:.0f} s (logs in {work})", flush=True)
    sgl = [SGLangEngine(SGLangClient(s.url), model, work_dir=work / f"w{i}", server=s) for i, s in enumerate(servers)]
    built_in = [TorchEngine(model, dtype="float32") for _ in range(args.replicas)]
    up = {"built-in": [WeightUpdater(e, f"torch-{i}", TOKEN, 600.0) for i, e in enumerate(built_in)],
          "sglang": [WeightUpdater(e, f"sglang-{i}", TOKEN, 600.0) for i, e in enumerate(sgl)]}
    sender = BucketedSender("127.0.0.1:0", TOKEN, bucket_bytes=64 << 20, chunk_bytes=1 << 20)
    times: dict[str, list[float]] = {"built-in": []}
    nbytes = 0
    try:
        version = 0
        for _ in range(args.rounds):
            modes: tuple[tuple[WeightPath, Verify], ...] = (("disk", "read_back"), ("distributed", "read_back"),
                                                             ("disk", "sent"), ("distributed", "sent"))
            for path, verify in modes:
                version += 1
                _, state = model_state(args.hidden, args.layers, version, vocab)
                manifest = sender.stage(version, version, list(state.items()))   # published
                nbytes = manifest.total_bytes
                for e in sgl:
                    e.weight_path, e.verify = path, verify
                order = ["built-in", "sglang"] if version % 2 else ["sglang", "built-in"]
                for kind in order:
                    total, each = publish_to_all(up[kind], manifest)
                    name = kind if kind == "built-in" else f"sglang {path} {verify}"
                    times.setdefault(name, []).append(total)
                    print(f"v{version} {name:30s}: every replica serving after {total * 1e3:8.1f} ms "
                          f"(replicas {', '.join(f'{s * 1e3:.0f}' for s in each)} ms)", flush=True)
        print("\none replica, one more version, by phase (no transport):", flush=True)
        phases: tuple[tuple[str, Engine], ...] = (("built-in", built_in[0]), ("sglang disk", sgl[0]),
                                                  ("sglang distributed", sgl[0]))
        for name, engine in phases:
            version += 1
            _, state = model_state(args.hidden, args.layers, version, vocab)
            if isinstance(engine, SGLangEngine):
                engine.weight_path, engine.verify = cast(WeightPath, name.split()[1]), "read_back"
            t0 = time.perf_counter()
            engine.update_weights_from_tensor(list(state.items()), version)
            t1 = time.perf_counter()
            held = dict(engine.named_weights())
            t2 = time.perf_counter()
            assert all(torch.equal(held[n], t) for n, t in state.items())
            print(f"{name:19s}: load {(t1 - t0) * 1e3:8.1f} ms | read back all weights {(t2 - t1) * 1e3:8.1f} ms",
                  flush=True)
    finally:
        sender.close()
        for torch_engine in built_in:
            torch_engine.shutdown()
        for e in sgl:
            e.shutdown()
    base = statistics.median(times["built-in"])
    print(f"\nmodel: hidden {args.hidden}, layers {args.layers}, {nbytes / 2**20:.1f} MiB per version; "
          f"{args.replicas} replicas per engine; transport bucketed (gRPC); acknowledged digest from each engine's "
          "named_weights (SGLang: read_back = every tensor read back from the server, sent = the tensors sent)")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:30s} median {med * 1e3:8.1f} ms over {len(ts)} versions | ratio to built-in {med / base:6.2f}x")


if __name__ == "__main__":
    main()
