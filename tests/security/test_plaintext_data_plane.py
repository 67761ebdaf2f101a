"""weight_sync.data_plane_tls false (off by default): the bucketed data plane without TLS, each Fetch carrying the
random token the manifest brings over the mTLS control plane. Integrity stays with the signatures: the trainer
refuses to run it unsigned, a replica without the public key refuses such a version, a forged one is refused; what
is lost (confidentiality on the wire) is what the config field says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.config import Config, ConfigError, parse_config
from rlfleet.security.signing import Signer, Verifier, generate_signing_key
from rlfleet.services.rollout.weight_updates import WeightUpdater
from rlfleet.services.trainer.publisher import plaintext_data_token
from rlfleet.services.weight_sync.transports.bucketed import BucketedSender, fetch
from rlfleet.services.weight_sync.transports.errors import WeightTransferError
from tests.security.pki_fixtures import make_pki
from tests.security.test_signed_weights import DictEngine, _signed, forged_of, tensors


def _cfg(tmp: Path, **security: object) -> Config:
    return parse_config({"run": {"name": "p", "dir": str(tmp)}, "model": {"path": str(tmp)},
                         "rollout": {"data_source": "examples.addition.data:train_prompts",
                                     "reward_fn": "examples.addition.reward:exact_match"},
                         "weight_sync": {"data_plane_tls": False}, "security": {"mode": "mtls", **security}}, "t")


def test_the_trainer_serves_plaintext_only_with_signed_weights(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs signed weights"):
        plaintext_data_token(_cfg(tmp_path))
    generate_signing_key(tmp_path / "k", tmp_path / "k.pub")
    signed = _cfg(tmp_path, signing_key=str(tmp_path / "k"), signing_public_key=str(tmp_path / "k.pub"))
    a, b = plaintext_data_token(signed), plaintext_data_token(signed)
    assert len(a) >= 32 and a != b
    default = parse_config({"run": {"name": "p", "dir": str(tmp_path)}, "model": {"path": str(tmp_path)},
                            "rollout": {"data_source": "x:y", "reward_fn": "x:y"}}, "t")
    assert default.weight_sync.data_plane_tls and plaintext_data_token(default) == ""


@pytest.mark.timeout(120)
def test_a_replica_fetches_with_the_manifest_token_and_checks_the_signature(tmp_path: Path) -> None:
    pki = make_pki()
    generate_signing_key(tmp_path / "k", tmp_path / "k.pub")
    signer, verifier = Signer.from_file(tmp_path / "k"), Verifier.from_file(tmp_path / "k.pub")
    sender = BucketedSender("127.0.0.1:0", "data-token-from-the-manifest", 1024)
    try:
        v1 = _signed(sender.stage, 1, tensors(1), signer)
        v1.data_plane_token = "data-token-from-the-manifest"
        got = fetch(v1, pki.good["rollout"], 10.0, "rollout-0")      # the identity is not asked for here
        assert all(torch.equal(t, want) for (_, t), (_, want) in zip(got, tensors(1), strict=True))
        wrong = type(v1)()
        wrong.CopyFrom(v1)
        wrong.data_plane_token = "guess"
        with pytest.raises(WeightTransferError, match="UNAUTHENTICATED"):
            fetch(wrong, pki.good["rollout"], 10.0, "rollout-0")

        engine = DictEngine(tensors(0))
        blind = WeightUpdater(engine, "r0", pki.good["rollout"], 10.0,
                              receivers=lambda t: fetch)                                            # no public key
        result = blind.apply(v1)
        assert not result.ok and "plaintext data plane" in result.error and engine.weight_version == 0
        checked = WeightUpdater(engine, "r0", pki.good["rollout"], 10.0, receivers=lambda t: fetch,
                                verifier=verifier)
        assert checked.apply(v1).ok and engine.weight_version == 1
        forged = sender.stage(2, 2, forged_of(tensors(2)))             # altered bytes on the wire, old signature
        forged.signature, forged.data_plane_token = v1.signature, "data-token-from-the-manifest"
        result = checked.apply(forged)
        assert not result.ok and engine.weight_version == 1, result.error
    finally:
        sender.close()
