"""A local run gives each process only its own key (issue 40 item 4): the run CA's key is never written, each
component's folder under RUN/pki holds its own key alone, a replica's environment names no other key and no signing
key, `rlfleet scale` replicas are issued from the CA in memory, and --resume gets a fresh CA, keeping the signing key.
Checked on the launcher's own set-up (resolve + LocalRun) and with a real buffer process answering the launcher."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from rlfleet.config import Config, load_config
from rlfleet.local.launcher import LocalRun, resolve, with_endpoints
from rlfleet.security.identity import IDENTITY_DIR_ENV, load_identity, role_and_name
from rlfleet.security.signing import SIGNING_KEY_ENV


def _config(tmp: Path) -> Config:
    (tmp / "d.jsonl").write_text('{"q": "1+1=", "a": "2"}\n')
    data = {"run": {"dir": str(tmp / "run")}, "model": {"path": str(tmp / "model")}, "trainer": {"world_size": 2},
            "rollout": {"replicas": 2, "reward_fn": "exact_match",
                        "data": {"path": str(tmp / "d.jsonl"), "prompt_field": "q", "label_field": "a", "chat": False}}}
    (tmp / "c.yaml").write_text(yaml.safe_dump(data))
    return load_config(tmp / "c.yaml")


def _set_up(tmp: Path, resume: bool = False) -> LocalRun:
    resolved = with_endpoints(resolve(_config(tmp), fresh=False, resume=resume))
    return LocalRun(resolved, resolved.run_dir / "config.resolved.yaml")


def _ca_public(folder: Path) -> bytes:
    cert = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    return cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _private_keys(run: Path) -> dict[Path, bytes]:
    """Every private key file under the run folder -> its public key (DER), whatever the file is called."""
    out = {}
    for path in run.rglob("*"):
        if path.is_file() and b"PRIVATE KEY" in path.read_bytes():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            out[path] = key.public_key().public_bytes(serialization.Encoding.DER,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo)
    return out


def _signed_by(cert_path: Path, ca_folder: Path) -> bool:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate((ca_folder / "ca.crt").read_bytes()))
    except Exception:
        return False
    return True


COMPONENTS = ("trainer-0", "trainer-1", "rollout-0", "rollout-1", "buffer", "weight_sync")


def test_no_ca_key_and_each_folder_holds_its_own_key_only(tmp_path: Path) -> None:
    pki = tmp_path / "run" / "pki"
    pki.mkdir(parents=True)
    (pki / "ca.key").write_bytes(b"left by an earlier version")        # the old layout: removed at set-up
    local = _set_up(tmp_path)
    run = tmp_path / "run"
    assert not list(run.rglob("ca.key"))
    keys = _private_keys(run)
    assert _ca_public(pki) not in keys.values()                # the CA key is in no file, under any name
    assert stat.S_IMODE(pki.stat().st_mode) == 0o700
    for name in COMPONENTS:
        folder = pki / name
        assert sorted(p.name for p in folder.iterdir()) == sorted([f"{name}.crt", f"{name}.key", "ca.crt"])
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / f"{name}.key").stat().st_mode) == 0o600
        assert _signed_by(folder / f"{name}.crt", pki)
        assert role_and_name((folder / f"{name}.crt").read_bytes())[1] == name
        assert load_identity(folder, name).name == name        # key and certificate belong together
    # the only private keys in the run folder: one per component, in its folder, and the signing key
    assert sorted(str(p.relative_to(pki)) for p in keys) == sorted(
        [f"{n}/{n}.key" for n in COMPONENTS] + ["signing/weights-signing.key"])
    assert "signing_key: null" in (yaml.safe_dump(local.cfg.model_dump(mode="json")["security"]))


def test_a_replica_is_told_only_its_own_folder_and_the_trainer_alone_the_signing_key(tmp_path: Path) -> None:
    local = _set_up(tmp_path)
    pki = tmp_path / "run" / "pki"
    env = local.child_env("rollout-1")
    values = "\n".join(f"{k}={v}" for k, v in env.items())
    assert env[IDENTITY_DIR_ENV] == str((pki / "rollout-1").resolve())
    for other in COMPONENTS:
        if other != "rollout-1":
            assert str(pki / other) not in values and f"{other}.key" not in values
    assert SIGNING_KEY_ENV not in env and str(pki / "signing") not in values and "weights-signing.key" not in values
    trainer = local.child_env("trainer-1")
    signing = Path(trainer[SIGNING_KEY_ENV])
    assert signing.is_file() and stat.S_IMODE(signing.stat().st_mode) == 0o600
    assert trainer[IDENTITY_DIR_ENV] == str((pki / "trainer-1").resolve())
    assert SIGNING_KEY_ENV not in local.child_env("buffer") and SIGNING_KEY_ENV not in local.child_env("weight_sync")


def test_scaled_replica_is_issued_from_the_ca_in_memory(tmp_path: Path) -> None:
    local = _set_up(tmp_path)
    pki = tmp_path / "run" / "pki"
    env = local.child_env("rollout-5")                         # what `rlfleet scale` adds starts with this
    assert env[IDENTITY_DIR_ENV] == str((pki / "rollout-5").resolve())
    assert _signed_by(pki / "rollout-5" / "rollout-5.crt", pki)
    assert not list((tmp_path / "run").rglob("ca.key"))


def test_resume_gets_a_fresh_ca_and_keeps_the_signing_key(tmp_path: Path) -> None:
    _set_up(tmp_path)
    pki = tmp_path / "run" / "pki"
    first_ca, first_cert = _ca_public(pki), (pki / "rollout-0" / "rollout-0.crt").read_bytes()
    signing = (pki / "signing" / "weights-signing.key").read_bytes()
    (tmp_path / "run" / "checkpoints").mkdir()                # a run folder with state: --resume continues it
    local = _set_up(tmp_path, resume=True)
    assert local.cfg.run.resume
    assert _ca_public(pki) != first_ca
    stale = pki / "old.crt"
    stale.write_bytes(first_cert)
    assert not _signed_by(stale, pki)                          # an earlier launch's certificate is not of this CA
    assert _signed_by(pki / "rollout-0" / "rollout-0.crt", pki)
    assert (pki / "signing" / "weights-signing.key").read_bytes() == signing
    assert not list((tmp_path / "run").rglob("ca.key"))


def test_legacy_signing_key_moves_out_of_the_shared_folder(tmp_path: Path) -> None:
    from rlfleet.security.signing import generate_signing_key

    pki = tmp_path / "run" / "pki"
    generate_signing_key(pki / "weights-signing.key", pki / "weights-signing.pub")
    old = (pki / "weights-signing.key").read_bytes()
    _set_up(tmp_path)
    assert not (pki / "weights-signing.key").exists()
    assert (pki / "signing" / "weights-signing.key").read_bytes() == old


def test_a_real_service_presents_its_own_identity_to_the_launcher(tmp_path: Path) -> None:
    local = _set_up(tmp_path)
    local.config_path.parent.mkdir(parents=True, exist_ok=True)
    from rlfleet.config import dump_config

    dump_config(local.cfg, local.config_path)
    try:
        local._start("buffer", "rlfleet.services.buffer", [])
        local._wait([local.cfg.endpoints.buffer], 60)          # mTLS with the launcher's in-memory identity
        stats = local.buffer_stats()
        assert stats is not None and stats["put_samples"] == 0
    finally:
        local.stop()
    assert os.path.exists(tmp_path / "run" / "logs" / "buffer.log")
