"""Container health check: ask the service's grpc.health.v1 endpoint on loopback (port from RLFLEET_HEALTH_PORT).

mtls (RLFLEET_PKI_DIR set): the check presents the pod's own certificate (RLFLEET_IDENTITY.crt/.key and ca.crt in
that folder, the layout rlfleet.security.identity.load_identity reads), since the servers require one; the kubelet's
own gRPC probe speaks no TLS.

Trainer ranks other than 0 serve no gRPC: in a trainer pod other than pod 0 (RLFLEET_POD_INDEX != 0, or RANK != 0
where a pod runs one rank) there is nothing to ask, and the check passes; such a rank's failure shows as its
container exiting (the pod's supervisor exits when any of its ranks does)."""

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _channel(address: str) -> grpc.Channel:
    pki = os.environ.get("RLFLEET_PKI_DIR", "")
    if not pki:
        return grpc.insecure_channel(address)
    folder, name = Path(pki), os.environ.get("RLFLEET_IDENTITY", "")
    creds = grpc.ssl_channel_credentials((folder / "ca.crt").read_bytes(), (folder / f"{name}.key").read_bytes(),
                                         (folder / f"{name}.crt").read_bytes())
    return grpc.secure_channel(address, creds)


def main() -> int:
    if os.environ.get("RLFLEET_POD_INDEX", os.environ.get("RANK", "0")) != "0":
        return 0
    port = os.environ.get("RLFLEET_HEALTH_PORT", "")
    if not port:
        print("RLFLEET_HEALTH_PORT is not set", file=sys.stderr)
        return 1
    try:
        with _channel(f"127.0.0.1:{port}") as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=4)
    except grpc.RpcError as exc:
        print(f"health check failed: {exc.code()}", file=sys.stderr)
        return 1
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
