"""The chart's mTLS (the default): cert-manager Certificates (or Secrets you make) with the identities
rlfleet.security.identity reads, mounted in each pod as the files load_identity expects.

cert-manager is not here, so its objects are checked against the fields its CRDs document, and its issuing is played
by a CA in the test: every rendered Certificate (and each rollout pod's csi-driver request) is signed as written, laid
out on disk exactly as the pod's volume would mount it, and the run's real servers then authenticate and authorize
the pods with it, over the DNS names the run config dials.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rlfleet.config import parse_config
from rlfleet.runtime.rpc import Server
from rlfleet.security.credentials import load_credential
from rlfleet.security.identity import IDENTITY_ENV, Identity
from rlfleet.security.pki import create_ca
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import start_server
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc
from tests.cluster.chart import ROOT, WORKLOAD_KINDS, all_pod_specs, by_kind, component, notes, pod_spec, render
from tests.cluster.tools import need_module

# cert-manager.io/v1 Certificate spec fields as its CRD documents them (required: issuerRef, secretName).
CERTIFICATE_FIELDS = {"additionalOutputFormats", "commonName", "dnsNames", "duration", "emailAddresses",
                      "encodeUsagesInRequest", "ipAddresses", "isCA", "issuerRef", "keystores", "literalSubject",
                      "nameConstraints", "otherNames", "privateKey", "renewBefore", "renewBeforePercentage",
                      "revisionHistoryLimit", "secretName", "secretTemplate", "signatureAlgorithm", "subject", "uris",
                      "usages"}
PRIVATE_KEY = {"algorithm": {"RSA", "ECDSA", "Ed25519"}, "encoding": {"PKCS1", "PKCS8"},
               "rotationPolicy": {"Never", "Always"}, "size": None}
USAGES = {"signing", "digital signature", "content commitment", "key encipherment", "key agreement",
          "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
          "client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user",
          "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"}
ISSUER_KINDS = {"acme", "ca", "selfSigned", "vault", "venafi"}          # an Issuer spec holds exactly one
# csi.cert-manager.io volume attributes the csi-driver documents
CSI_ATTRIBUTES = {"issuer-name", "issuer-kind", "issuer-group", "common-name", "dns-names", "ip-sans", "uri-sans",
                  "duration", "is-ca", "key-usages", "key-encoding", "ca-file", "certificate-file", "privatekey-file",
                  "fs-group", "renew-before", "reuse-private-key", "literal-subject", "pkcs12-enable",
                  "pkcs12-filename", "pkcs12-password"}
GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$")
PKI = "/etc/rlfleet-pki"
SIGNING = "run1-weights-signing"
POD = "run1-rollout-7d9f-abcde"                 # the rollout pod the csi-driver issues for, in the test


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    need_module("helm_python")


def certificate_problems(obj: dict[str, Any]) -> list[str]:
    name, spec = obj["metadata"]["name"], obj["spec"]
    out = [f"{name}: unknown field spec.{k}" for k in set(spec) - CERTIFICATE_FIELDS]
    out += [f"{name}: spec.{k} is required" for k in ("issuerRef", "secretName") if not spec.get(k)]
    ref = spec.get("issuerRef", {})
    out += [f"{name}: unknown field issuerRef.{k}" for k in set(ref) - {"name", "kind", "group"}]
    for key, value in spec.get("privateKey", {}).items():
        allowed = PRIVATE_KEY.get(key, set())
        if key not in PRIVATE_KEY or (allowed is not None and value not in allowed):
            out.append(f"{name}: privateKey.{key}: {value!r}")
    out += [f"{name}: unknown usage {u!r}" for u in spec.get("usages", []) if u not in USAGES]
    out += [f"{name}: {k} {spec[k]!r} is no Go duration" for k in ("duration", "renewBefore")
            if k in spec and not GO_DURATION.match(spec[k])]
    for k in ("dnsNames", "uris", "ipAddresses", "usages"):
        if k in spec and not (isinstance(spec[k], list) and all(isinstance(v, str) for v in spec[k])):
            out.append(f"{name}: spec.{k} must be a list of strings")
    return out


def _workload_pods(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: spec for o in objects if o["kind"] in WORKLOAD_KINDS
            for spec in all_pod_specs(o)}


def _env(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


SERVICES = {"run1-buffer": "buffer", "run1-weight-sync": "weight_sync", "run1-trainer": "trainer",
            "run1-rollout": "rollout", "run1-controller": "controller"}


def test_default_is_mtls_with_a_cert_manager_run_ca() -> None:
    objects = render()
    issuers = {i["metadata"]["name"]: i["spec"] for i in by_kind(objects, "Issuer")}
    assert issuers == {"run1-selfsigned": {"selfSigned": {}}, "run1-ca": {"ca": {"secretName": "run1-ca"}}}
    assert all(len(set(spec) & ISSUER_KINDS) == 1 for spec in issuers.values())
    certs = {c["metadata"]["name"]: c["spec"] for c in by_kind(objects, "Certificate")}
    problems = [p for c in by_kind(objects, "Certificate") for p in certificate_problems(c)]
    assert not problems, problems
    assert certs["run1-ca"]["isCA"] and certs["run1-ca"]["issuerRef"]["name"] == "run1-selfsigned"
    uris = {name: spec["uris"] for name, spec in certs.items() if name not in ("run1-ca", SIGNING)}
    assert uris == {"run1-trainer": ["spiffe://rlfleet/trainer/trainer"], "run1-buffer": ["spiffe://rlfleet/buffer/buffer"],
                    "run1-weight-sync": ["spiffe://rlfleet/weight_sync/weight_sync"],
                    "run1-controller": ["spiffe://rlfleet/controller/controller"],
                    "run1-operator": ["spiffe://rlfleet/operator/operator"]}
    for name, spec in certs.items():
        if name not in ("run1-ca", SIGNING):
            assert spec["issuerRef"] == {"name": "run1-ca", "kind": "Issuer", "group": "cert-manager.io"}
            assert {"server auth", "client auth"} <= set(spec["usages"]) and "127.0.0.1" in spec["ipAddresses"]
    cfg = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "run1-config")
    security = parse_config(yaml.safe_load(cfg["data"]["config.yaml"]), "chart").security
    assert (security.mode, security.pki_dir) == ("mtls", PKI)
    assert not [s for s in by_kind(objects, "Secret") if s["metadata"]["name"] == "run1-token"]
    pods = _workload_pods(objects)
    for workload, identity in SERVICES.items():
        c = pods[workload]["containers"][0]
        env = _env(c)
        assert env[IDENTITY_ENV] == identity and env["RLFLEET_PKI_DIR"] == PKI and "RLFLEET_TOKEN" not in env
        assert {"name": "pki", "mountPath": PKI, "readOnly": True} in c["volumeMounts"]
        (vol,) = [v for v in pods[workload]["volumes"] if v["name"] == "pki"]
        if identity == "rollout":
            attrs = vol["csi"]["volumeAttributes"]
            assert vol["csi"]["driver"] == "csi.cert-manager.io" and vol["csi"]["readOnly"] is True
            assert {k.removeprefix("csi.cert-manager.io/") for k in attrs} <= CSI_ATTRIBUTES
            assert attrs["csi.cert-manager.io/uri-sans"] == "spiffe://rlfleet/rollout/${POD_NAME}"
            assert "--replica-id=$(POD_NAME)" in c["args"]          # the replica id is the certificate's name
        else:
            assert vol["secret"]["secretName"] == f"{workload}-tls"
            assert vol["secret"]["items"] == [{"key": "tls.crt", "path": f"{identity}.crt"},
                                              {"key": "tls.key", "path": f"{identity}.key"},
                                              {"key": "ca.crt", "path": "ca.crt"}]
    assert not any("RLFLEET_TOKEN" in _env(c) for spec in pods.values() for c in spec["containers"])


def test_an_issuer_of_your_own_signs_everything_and_no_ca_is_made() -> None:
    objects = render({"security": {"certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}})
    assert not by_kind(objects, "Issuer")
    refs = [c["spec"]["issuerRef"] for c in by_kind(objects, "Certificate")]
    assert len(refs) == 6 and all(r == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
                                  for r in refs)
    attrs = next(v for v in pod_spec(component(objects, "Deployment", "rollout"))["volumes"]
                 if v["name"] == "pki")["csi"]["volumeAttributes"]
    assert (attrs["csi.cert-manager.io/issuer-name"], attrs["csi.cert-manager.io/issuer-kind"]) == \
        ("corp-ca", "ClusterIssuer")


SECRETS = {"trainer": "my-trainer", "buffer": "my-buffer", "weightSync": "my-ws", "controller": "my-ctl",
           "rollout": "my-rollout"}


def test_secrets_you_make_replace_cert_manager() -> None:
    with pytest.raises(Exception, match="weightSigning.existingSecret"):      # signed weights stay on
        render({"security": {"existingSecrets": SECRETS}})
    objects = render({"security": {"existingSecrets": SECRETS, "weightSigning": {"existingSecret": "my-signing"}}})
    assert not by_kind(objects, "Certificate") and not by_kind(objects, "Issuer")
    pods = _workload_pods(objects)
    mounted = {w: next(v for v in pods[w]["volumes"] if v["name"] == "pki")["secret"]["secretName"]
               for w in SERVICES}
    assert mounted == {"run1-buffer": "my-buffer", "run1-weight-sync": "my-ws", "run1-trainer": "my-trainer",
                       "run1-rollout": "my-rollout", "run1-controller": "my-ctl"}
    assert "--replica-id=rollout-0" in pods["run1-rollout"]["containers"][0]["args"]   # the one rollout identity
    with pytest.raises(Exception, match="existingSecrets.controller"):
        render({"security": {"existingSecrets": {k: v for k, v in SECRETS.items() if k != "controller"},
                             "weightSigning": {"enabled": False}}})
    with pytest.raises(Exception, match="rollout.replicas 1"):
        render({"security": {"existingSecrets": SECRETS, "weightSigning": {"enabled": False}},
                "rollout": {"replicas": 2}})


def test_token_and_none_are_asked_for_explicitly() -> None:
    token = render({"security": {"mode": "token"}})
    assert [s["metadata"]["name"] for s in by_kind(token, "Secret") if s["metadata"]["name"] == "run1-token"]
    assert not by_kind(token, "Certificate")
    buffer = pod_spec(component(token, "Deployment", "buffer"))
    assert "RLFLEET_TOKEN" in _env(buffer["containers"][0]) and not [v for v in buffer["volumes"] if v["name"] == "pki"]
    assert buffer["containers"][0]["readinessProbe"]["grpc"]["port"] == 50051
    none = render({"security": {"mode": "none", "allowInsecure": True}})
    env = _env(pod_spec(component(none, "Deployment", "buffer"))["containers"][0])
    assert "RLFLEET_TOKEN" not in env and IDENTITY_ENV not in env
    with pytest.raises(Exception, match="set security.mode only"):
        render({"runConfig": {"security": {"mode": "token"}}})


def test_mode_none_renders_only_when_asked_for_as_insecure_and_then_warns_loudly() -> None:
    """security.mode none without security.allowInsecure: true fails the render naming both; allowed, NOTES.txt
    (what helm install prints) opens with a warning; mtls and token print none."""
    with pytest.raises(Exception, match="security.allowInsecure: true"):
        render({"security": {"mode": "none"}})
    with pytest.raises(Exception, match="security.allowInsecure: true"):
        render({"security": {"mode": "none", "allowInsecure": False}})
    warned = notes({"security": {"mode": "none", "allowInsecure": True}})
    assert warned.lstrip().startswith("#") and "WARNING: security.mode is none" in warned
    assert "anyone who can reach a pod of run1" in warned
    for values in ({}, {"security": {"mode": "token"}}):
        assert "WARNING" not in notes(values)


# -- cert-manager's part, played here ----------------------------------------------------------------------------

def _issue(ca: Any, uris: list[str], dns: list[str], ips: list[str], common_name: str) -> tuple[bytes, bytes]:
    """What a cert-manager CA issuer returns for a request: a key and a certificate with exactly these SANs."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
    sans += [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca.key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def _mount(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
        (folder / name).chmod(0o600)
    return folder


def _mounted_pki(objects: list[dict], tmp: Path) -> dict[str, Path]:
    """Each service pod's /etc/rlfleet-pki as its volume mounts it: Secrets from the rendered Certificates, the
    rollout pod's files from its csi-driver attributes (${POD_NAME} = POD)."""
    ca = create_ca("cert-manager stand-in")
    secrets = {}
    for c in by_kind(objects, "Certificate"):
        s = c["spec"]
        if not s.get("isCA") and c["metadata"]["name"] != SIGNING:    # the signing key is no identity (below)
            key, crt = _issue(ca, s["uris"], s["dnsNames"], s["ipAddresses"], s["commonName"])
            secrets[s["secretName"]] = {"tls.crt": crt, "tls.key": key, "ca.crt": ca.cert_pem}
    out = {}
    for workload, spec in _workload_pods(objects).items():
        if workload not in SERVICES:
            continue
        vol = next(v for v in spec["volumes"] if v["name"] == "pki")
        if "secret" in vol:
            data = secrets[vol["secret"]["secretName"]]
            files = {item["path"]: data[item["key"]] for item in vol["secret"]["items"]}
        else:
            a = {k.removeprefix("csi.cert-manager.io/"): v.replace("${POD_NAME}", POD)
                 for k, v in vol["csi"]["volumeAttributes"].items()}
            key, crt = _issue(ca, [a["uri-sans"]], a["dns-names"].split(","), a["ip-sans"].split(","),
                              a["common-name"])
            files = {a["certificate-file"]: crt, a["privatekey-file"]: key, a["ca-file"]: ca.cert_pem}
        out[SERVICES[workload]] = _mount(tmp / workload, files)
    return out


def _identity(objects: list[dict], folders: dict[str, Path], service: str,
              monkeypatch: pytest.MonkeyPatch) -> Identity:
    """The credential `service` loads in its pod: the rendered config and the pod's env, its mounted folder."""
    cfg = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "run1-config")
    security = parse_config(yaml.safe_load(cfg["data"]["config.yaml"]), "chart").security
    workload = next(w for w, s in SERVICES.items() if s == service)
    monkeypatch.setenv(IDENTITY_ENV, _env(_workload_pods(objects)[workload]["containers"][0])[IDENTITY_ENV])
    cred = load_credential(security.model_copy(update={"pki_dir": str(folders[service])}), service)
    assert isinstance(cred, Identity)
    return cred


def _dial(address: str, host: str, who: Identity) -> grpc.Channel:
    """A channel to `address` that verifies the server's certificate for `host`: the name the run config dials."""
    creds = grpc.ssl_channel_credentials(who.ca_pem, who.key_pem, who.cert_pem)
    return grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", host)])


def _code(fn: Any, request: Any) -> grpc.StatusCode:
    try:
        fn(request, timeout=5)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.timeout(120)
def test_mounted_certificates_authenticate_the_pods_to_the_real_servers(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render()
    folders = _mounted_pki(objects, tmp_path / "pods")
    ids = {s: _identity(objects, folders, s, monkeypatch) for s in SERVICES.values()}
    assert {s: (i.role, i.name) for s, i in ids.items()} == {
        "buffer": ("buffer", "buffer"), "weight_sync": ("weight_sync", "weight_sync"),
        "trainer": ("trainer", "trainer"), "rollout": ("rollout", POD), "controller": ("controller", "controller")}

    core = BufferCore(EmbeddedStore(tmp_path / "buffer", fsync="no"),
                      BufferSettings(capacity=16, group_size=2, groups_per_step=1, steps=4))
    buffer = start_server(core, "127.0.0.1:0", ids["buffer"])
    trainer = Server("127.0.0.1:0", ids["trainer"], max_workers=4)
    trainer.start()
    try:
        address = f"127.0.0.1:{buffer.port}"
        host = "run1-buffer.team-a.svc.cluster.local"                  # endpoints.buffer in the rendered config
        with _dial(address, host, ids["rollout"]) as ch:
            stub = buffer_pb2_grpc.BufferStub(ch)
            assert _code(stub.Claim, buffer_pb2.ClaimRequest(replica_id=POD, max_groups=1)) == grpc.StatusCode.OK
            assert _code(stub.Claim, buffer_pb2.ClaimRequest(replica_id="run1-rollout-other", restarted=True)) \
                == grpc.StatusCode.PERMISSION_DENIED                     # another replica's tickets: refused
            assert _code(stub.GetBatch, buffer_pb2.GetBatchRequest(step=0)) == grpc.StatusCode.PERMISSION_DENIED
        with _dial(address, host, ids["trainer"]) as ch:
            stub = buffer_pb2_grpc.BufferStub(ch)
            assert _code(stub.GetBatch, buffer_pb2.GetBatchRequest(step=0)) == grpc.StatusCode.OK
            assert _code(stub.Reject, buffer_pb2.RejectRequest(step=0, reason="x")) == \
                grpc.StatusCode.INVALID_ARGUMENT                         # allowed; no batch delivered yet
        with _dial(address, host, ids["controller"]) as ch:
            stub = buffer_pb2_grpc.BufferStub(ch)
            assert _code(stub.Stats, buffer_pb2.StatsRequest()) == grpc.StatusCode.OK
            assert _code(stub.Ack, buffer_pb2.AckRequest()) == grpc.StatusCode.PERMISSION_DENIED
        with _dial(address, "run1-weight-sync.team-a.svc.cluster.local", ids["rollout"]) as ch:
            assert _code(buffer_pb2_grpc.BufferStub(ch).Claim, buffer_pb2.ClaimRequest(replica_id=POD)) == \
                grpc.StatusCode.UNAVAILABLE                              # the buffer's certificate names only itself
        # the trainer's one certificate serves rank 0's per-pod DNS name (StatefulSet and JobSet alike)
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        for rank0 in ("run1-trainer-0.run1-trainer.team-a.svc.cluster.local",
                      "run1-trainer-rank-0-0.run1-trainer.team-a.svc.cluster.local"):
            with _dial(f"127.0.0.1:{trainer.port}", rank0, ids["rollout"]) as ch:
                assert _code(health_pb2_grpc.HealthStub(ch).Check, health_pb2.HealthCheckRequest()) == \
                    grpc.StatusCode.OK
        # the pods' health check (the image's, as the probes run it) presents the mounted certificate
        env = {**os.environ, "RLFLEET_PKI_DIR": str(folders["rollout"]), IDENTITY_ENV: "rollout",
               "RLFLEET_HEALTH_PORT": str(buffer.port)}
        check = subprocess.run([sys.executable, str(ROOT / "docker" / "healthcheck.py")], env=env,
                               capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        env.pop("RLFLEET_PKI_DIR")
        assert subprocess.run([sys.executable, str(ROOT / "docker" / "healthcheck.py")], env=env,
                              capture_output=True, timeout=30).returncode == 1     # no certificate: refused
    finally:
        buffer.stop(0)
        trainer.stop(0)
        core.close()


def test_weights_are_signed_by_default_with_a_key_only_trainer_pods_hold(tmp_path: Path) -> None:
    """The chart's Ed25519 Certificate (never rotated) is the signing key: trainer pods mount tls.key and tls.crt,
    replicas tls.crt alone, and the run config points signing_key / signing_public_key there. Issued as cert-manager
    would (a self-signed certificate over a fresh Ed25519 key stands in), the trainer's Signer and the replica's
    Verifier agree on a signed statement, and a forged one is refused."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from rlfleet.security.signing import SignatureError, Signer, Verifier

    objects = render()
    cert = next(c for c in by_kind(objects, "Certificate") if c["metadata"]["name"] == SIGNING)
    assert not certificate_problems(cert)
    assert cert["spec"]["privateKey"] == {"algorithm": "Ed25519", "encoding": "PKCS8", "rotationPolicy": "Never"}
    pods = _workload_pods(objects)
    held = {}
    for workload in ("run1-trainer", "run1-rollout", "run1-buffer", "run1-weight-sync"):
        vols = [v for v in pods[workload]["volumes"] if v["name"] == "signing"]
        held[workload] = [i["key"] for v in vols for i in v["secret"]["items"]
                          if v["secret"]["secretName"] == cert["spec"]["secretName"]]
    assert held == {"run1-trainer": ["tls.crt", "tls.key"], "run1-rollout": ["tls.crt"], "run1-buffer": [],
                    "run1-weight-sync": []}
    cfg = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "run1-config")
    security = parse_config(yaml.safe_load(cfg["data"]["config.yaml"]), "chart").security
    assert (security.signing_key, security.signing_public_key) == ("/etc/rlfleet-signing/weights-signing.key",
                                                                   "/etc/rlfleet-signing/weights-signing.crt")
    key = Ed25519PrivateKey.generate()                 # what cert-manager writes: tls.key PKCS8, tls.crt over it
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cert["spec"]["commonName"])])
    now = dt.datetime.now(dt.UTC)
    crt = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
           .serial_number(x509.random_serial_number()).not_valid_before(now)
           .not_valid_after(now + dt.timedelta(days=1)).sign(key, None))
    (tmp_path / "weights-signing.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    os.chmod(tmp_path / "weights-signing.key", 0o600)
    (tmp_path / "weights-signing.crt").write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    signer, verifier = Signer.from_file(tmp_path / "weights-signing.key"), Verifier.from_file(
        tmp_path / "weights-signing.crt")
    signature = signer.sign(b"ctx", b"version 7")
    verifier.check(b"ctx", b"version 7", signature, "version 7")
    with pytest.raises(SignatureError):
        verifier.check(b"ctx", b"version 8", signature, "version 8")
    off = render({"security": {"weightSigning": {"enabled": False}}})
    assert not [c for c in by_kind(off, "Certificate") if c["metadata"]["name"] == SIGNING]
    cfg_off = next(o for o in by_kind(off, "ConfigMap") if o["metadata"]["name"] == "run1-config")
    assert parse_config(yaml.safe_load(cfg_off["data"]["config.yaml"]), "chart").security.signing_key is None
