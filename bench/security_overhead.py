"""What security costs, measured in one run against the same-run baseline without it.

1. Hashing and signing per core: BLAKE3 (1 thread), SHA-256, xxh64 GB/s; Ed25519 sign/verify of a manifest.
2. Bucketed weight sync GB/s, security off (no TLS, unsigned) vs on (mTLS channels, HashingTee + Ed25519 on the
   sender, signature + BLAKE3 of every tensor on the receiver), same tensors, same process pair; and signed over a
   plaintext data plane with a fetch token (weight_sync.data_plane_tls false: the control plane stays mTLS).
3. (--run) The addition example's steady samples/s with security.mode none vs mtls (signed weights), both runs here.

Usage: PYTHONPATH=$PWD python bench/security_overhead.py [--mb 128] [--rounds 3] [--run --steps 20]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import secrets
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import blake3
import torch
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlfleet.security.identity import Identity  # noqa: E402
from rlfleet.security.pki import create_ca, issue  # noqa: E402
from rlfleet.security.signing import (  # noqa: E402
    HashingTee,
    Signer,
    Verifier,
    generate_signing_key,
    sign_manifest,
    verify_weights,
)
from rlfleet.services.weight_sync.transports.bucketed import BucketedSender, fetch  # noqa: E402


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def per_core(mb: int) -> None:
    data = torch.randint(0, 255, (mb << 20,), dtype=torch.uint8).numpy().tobytes()
    for name, fn in (("blake3 (1 thread)", lambda: blake3.blake3(data).digest()),
                     ("blake3 (auto threads)", lambda: blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()),
                     ("sha256", lambda: hashlib.sha256(data).digest()), ("xxh64", lambda: xxhash.xxh64(data).digest())):
        fn()
        t0 = time.perf_counter()
        fn()
        print(f"{name:22s} {gbps(len(data), time.perf_counter() - t0):6.2f} GB/s")


def params(mb: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    n = max(1, mb // 4)
    return [(f"layers.{i}.weight", torch.randn(1024, 1024, generator=g)) for i in range(n)]


def identities() -> tuple[Identity, Identity]:
    ca = create_ca()
    t, r = issue(ca, "trainer", "trainer-0"), issue(ca, "rollout", "rollout-0")
    return (Identity("trainer", "trainer-0", t.key_pem, t.cert_pem, ca.cert_pem),
            Identity("rollout", "rollout-0", r.key_pem, r.cert_pem, ca.cert_pem))


def _sender(conn: Connection, mb: int, trainer: Identity | None, key: str | None,
            plain_data: bool = False) -> None:
    torch.set_num_threads(1)
    data_token = secrets.token_urlsafe(32) if plain_data else ""
    sender = BucketedSender("127.0.0.1:0", data_token or trainer, 64 << 20)
    signer = Signer.from_file(key) if key else None
    for version in (1, 2, 3):
        named = params(mb, version)
        t0 = time.perf_counter()
        if signer is not None:
            tee = HashingTee(named)
            manifest = sender.stage(version, version, tee)
            sign_manifest(manifest, tee.digests, signer)
        else:
            manifest = sender.stage(version, version, named)
        manifest.data_plane_token = data_token
        conn.send((manifest.SerializeToString(), time.perf_counter() - t0))
        conn.recv()
    sender.close()


def weight_sync(mb: int, tls: bool, sign: bool, tmp: Path, plain_data: bool = False) -> float:
    from rlfleet.v1 import weights_pb2

    trainer, rollout = identities() if tls else (None, None)
    key = None
    verifier = None
    if sign:
        tmp.mkdir(parents=True, exist_ok=True)
        generate_signing_key(tmp / "k", tmp / "k.pub")
        key, verifier = str(tmp / "k"), Verifier.from_file(tmp / "k.pub")
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_sender, args=(child, mb, trainer, key, plain_data))
    proc.start()
    rates = []
    for _ in range(3):
        raw, stage_s = parent.recv()
        manifest = weights_pb2.WeightManifest.FromString(raw)
        t0 = time.perf_counter()
        got = fetch(manifest, rollout, 120.0, "rollout-0")
        if verifier is not None:
            verify_weights(manifest, got, verifier)
        rates.append(gbps(manifest.total_bytes, stage_s + time.perf_counter() - t0))
        parent.send("next")
    proc.join(60)
    return max(rates[1:])


def addition(steps: int) -> None:
    from examples.addition.warm_start import prepare_in_process as prepare
    from rlfleet.runtime.metrics import read_jsonl
    from tests.support.runs import run_rlfleet

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "warm"
        prepare(str(model), seed=0)
        rates = {}
        for mode in ("none", "mtls"):
            run_dir = Path(tmp) / mode
            res = run_rlfleet(run_dir, model, {"trainer.steps": steps, "eval.every_steps": 0, "security.mode": mode})
            if res.returncode != 0:
                raise SystemExit(res.stderr[-2000:])
            rows = [r for r in read_jsonl(run_dir / "metrics" / "trainer.jsonl") if "loss" in r]
            rates[mode] = sum(r["samples"] for r in rows[1:]) / (rows[-1]["time"] - rows[0]["time"])
            print(f"addition security.mode={mode}: {rates[mode]:.1f} samples/s steady "
                  f"({json.loads((run_dir / 'summary.json').read_text())['samples_per_s']:.1f} incl. start-up)")
        print(f"addition samples/s mtls/none: {rates['mtls'] / rates['none']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args()
    torch.set_num_threads(1)
    per_core(ns.mb)
    with tempfile.TemporaryDirectory() as tmp:
        cases = {"tls=False signed=False": (False, False, False), "tls=True signed=False": (True, False, False),
                 "tls=False signed=True": (False, True, False), "tls=True signed=True": (True, True, False),
                 "signed, plaintext data plane + fetch token": (True, True, True)}
        rates: dict[str, float] = {}
        for r in range(ns.rounds):          # cases interleaved, best of the rounds: a busy machine's noise averages out
            for i, (label, (tls, sign, plain)) in enumerate(cases.items()):
                rate = weight_sync(ns.mb, tls, sign, Path(tmp) / f"{r}-{i}", plain)
                rates[label] = max(rates.get(label, 0.0), rate)
    off = rates["tls=False signed=False"]
    for label, gbps in rates.items():
        print(f"bucketed weight sync {ns.mb} MB (stage + fetch) {label}: {gbps:.3f} GB/s (x{gbps / off:.3f} of off)")
    if ns.run:
        addition(ns.steps)


if __name__ == "__main__":
    main()
