"""The committed stubs match the .proto files, and every service contract has the RPCs the design names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlfleet.v1 import buffer_pb2, rollout_pb2, trainer_pb2, weight_sync_pb2

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_are_fresh() -> None:
    result = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_stale_stub_is_detected(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    subprocess.run(["cp", "-r", str(ROOT / "proto"), str(ROOT / "rlfleet"), str(ROOT / "scripts"), str(tmp_path)],
                   check=True)
    copy = tmp_path
    proto = copy / "proto" / "rlfleet" / "v1" / "trainer.proto"
    proto.write_text(proto.read_text().replace("bool finished = 6;", "bool finished = 6;\n  string note = 8;"))
    result = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=copy, capture_output=True,
                            text=True)
    assert result.returncode == 1
    assert "trainer_pb2" in result.stderr


def test_a_generator_other_than_the_locked_one_is_named(tmp_path: Path) -> None:
    """Stubs equal but for the version stamps (what a newer grpcio-tools writes): still stale (the stamps set the
    oldest runtime the stubs accept), and the message says the generator is not the locked one."""
    subprocess.run(["cp", "-r", str(ROOT / "proto"), str(ROOT / "rlfleet"), str(ROOT / "scripts"), str(tmp_path)],
                   check=True)
    stub = tmp_path / "rlfleet" / "v1" / "buffer_pb2_grpc.py"
    text = stub.read_text()
    assert "GRPC_GENERATED_VERSION = '" in text
    stub.write_text(text.replace("GRPC_GENERATED_VERSION = '", "GRPC_GENERATED_VERSION = '0.", 1))
    result = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 1
    assert "stale generated stubs: ['buffer_pb2_grpc.py']" in result.stderr
    assert "only the generator's version stamps differ" in result.stderr


def _methods(module: object, service: str) -> set[str]:
    return set(module.DESCRIPTOR.services_by_name[service].methods_by_name)  # type: ignore[attr-defined]


def test_service_contracts() -> None:
    assert _methods(rollout_pb2, "Rollout") >= {"Generate", "Pause", "Resume", "LoadWeights", "Status"}
    assert _methods(buffer_pb2, "Buffer") >= {"Put", "GetBatch", "Ack", "Stats", "Claim"}
    assert _methods(trainer_pb2, "Trainer") >= {"Status", "Checkpoint"}
    assert _methods(weight_sync_pb2, "WeightSync") >= {"Publish", "Subscribe", "Ack", "Verify"}
