"""cert-manager's part where the chart asks cert-manager (no `security.existingSecrets`), played with rlfleet's run CA:
cert-manager cannot run here, so each rendered Certificate becomes the Secret it names, issued as its spec asks
(identity from its spiffe URI, its DNS names; an Ed25519 key for the weight-signing Certificate, whose tls.crt is
then the public key PEM, which the chart accepts), and a `csi.cert-manager.io` volume becomes its pod's own
certificate (`${POD_NAME}` filled in), as the csi-driver issues one per pod. The self-signed Issuer, the CA
Certificate and the CA Issuer are that run CA. This is what lets the played run scale its replicas: under
existingSecrets every replica has one identity and the chart refuses more than one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlfleet.security.pki import URI_PREFIX, create_ca, issue
from rlfleet.security.signing import generate_signing_key

CSI = "csi.cert-manager.io"


class PlayIssuer:
    def __init__(self) -> None:
        self.ca = create_ca("rlfleet play run CA (cert-manager's part)")
        self.issued: dict[str, dict[str, bytes]] = {}     # what cert-manager keeps: a re-render (helm upgrade) finds
                                                          # each Secret as it was, the signing key above all

    def _issue(self, uri: str, hosts: list[str], where: str) -> tuple[bytes, bytes]:
        if not uri.startswith(URI_PREFIX):
            raise ValueError(f"{where}: URI SAN {uri!r} is not an rlfleet identity ({URI_PREFIX}ROLE/NAME)")
        role, name = uri.removeprefix(URI_PREFIX).split("/", 1)
        issued = issue(self.ca, role, name, hosts=[h for h in hosts if h])
        return issued.cert_pem, issued.key_pem

    def certificate(self, obj: dict[str, Any]) -> dict[str, bytes] | None:
        """The Secret data of a Certificate (None for the CA Certificate: the run CA plays it)."""
        spec, where = obj["spec"], f"Certificate {obj['metadata']['name']}"
        if spec.get("isCA"):
            return None
        if spec["secretName"] not in self.issued:
            self.issued[spec["secretName"]] = self._certificate(spec, where)
        return self.issued[spec["secretName"]]

    def _certificate(self, spec: dict[str, Any], where: str) -> dict[str, bytes]:
        if spec.get("privateKey", {}).get("algorithm") == "Ed25519":
            with tempfile.TemporaryDirectory() as tmp:
                generate_signing_key(Path(tmp) / "k", Path(tmp) / "p")
                return {"tls.key": (Path(tmp) / "k").read_bytes(), "tls.crt": (Path(tmp) / "p").read_bytes(),
                        "ca.crt": self.ca.cert_pem}
        uris = spec.get("uris") or []
        if len(uris) != 1:
            raise ValueError(f"{where}: {len(uris)} URI SANs; the played issuer expects one identity")
        crt, key = self._issue(uris[0], [*spec.get("dnsNames", []), *spec.get("ipAddresses", [])], where)
        return {"tls.crt": crt, "tls.key": key, "ca.crt": self.ca.cert_pem}

    def csi_files(self, attributes: dict[str, str], pod: str, where: str) -> dict[str, bytes]:
        """The files a csi.cert-manager.io volume holds for `pod`: certificate, key and CA, under the names its
        attributes give."""
        if pod in self.issued:                            # the csi-driver's certificate lives as long as the pod
            return self.issued[pod]
        attr = {k.removeprefix(f"{CSI}/"): v.replace("${POD_NAME}", pod) for k, v in attributes.items()}
        hosts = [h for key in ("dns-names", "ip-sans") for h in attr.get(key, "").split(",")]
        crt, key = self._issue(attr.get("uri-sans", ""), hosts, where)
        self.issued[pod] = {attr.get("certificate-file", "tls.crt"): crt, attr.get("privatekey-file", "tls.key"): key,
                            attr.get("ca-file", "ca.crt"): self.ca.cert_pem}
        return self.issued[pod]
