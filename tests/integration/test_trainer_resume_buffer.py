"""A starting trainer reports its checkpoint to a buffer that cannot read the checkpoint folder (as in the chart, where
only trainer pods mount it): Buffer.TrainerResume over real gRPC on loopback, the buffer's log in a run folder of its
own. What a checkpoint sealed before the trainer stopped committed is never trained twice, even when the buffer lost
the batch's delivery; a checkpoint older than the buffer's committed step is refused and nothing changes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.runtime.rpc import Server
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.results import BatchResult
from rlfleet.services.buffer.server import start_server
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.services.trainer.clients import BufferClient, PeerError
from rlfleet.services.trainer.resume_report import report_resume
from rlfleet.v1 import sample_pb2
from tests.integration.test_buffer_contract import make_sample
from tests.unit.test_buffer_durability import SETTINGS, fingerprint

TOKEN = "test-token"


class Buffer:
    """A buffer core on an embedded log in its own folder, served on loopback; reopened on the same folder."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.core: BufferCore | None = None
        self.server: Server | None = None

    def open(self) -> BufferCore:
        self.core = BufferCore(EmbeddedStore(self.dir), SETTINGS)
        return self.core

    def serve(self) -> BufferClient:
        assert self.core is not None
        self.server = start_server(self.core, "127.0.0.1:0", TOKEN)
        return BufferClient(f"127.0.0.1:{self.server.port}", TOKEN)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.core is not None:
            self.core.close()
            self.core = None


@pytest.fixture()
def buffer(tmp_path: Path) -> Iterator[Buffer]:
    b = Buffer(tmp_path / "buffer_run" / "buffer")
    yield b
    b.close()


def fill_ready(core: BufferCore, groups: int) -> None:
    for _ in range(groups):
        (t,) = core.claim("r", 0, 1, 0).tickets
        core.put([make_sample(t.group_id, i, 2) for i in range(2)], 0)


def sample_ids(batch: BatchResult) -> list[str]:
    return [f"{m.group_id}/{m.index}" for m in map(sample_pb2.Sample.FromString, batch.samples)]


def write_checkpoint(run_dir: Path, step: int, sample_ids: list[str]) -> None:
    """A complete checkpoint folder as the trainer leaves it, of the files the committed-id scan reads: its
    committed ids, meta.json and checksums.json listing each file with its size (written here from the layout)."""
    folder = run_dir / "checkpoints" / f"step_{step:08d}"
    folder.mkdir(parents=True)
    ids = folder / "committed_ids_rank00000.json"
    ids.write_text(json.dumps(sample_ids))
    (folder / "meta.json").write_text(json.dumps({"step": step, "version": step + 1, "world_size": 1}))
    (folder / "checksums.json").write_text(json.dumps({ids.name: {"bytes": ids.stat().st_size}}))


@pytest.mark.parametrize("buffer_lost_the_delivery", [False, True])
def test_a_checkpoint_sealed_before_its_ack_is_never_trained_twice(tmp_path: Path, buffer: Buffer,
                                                                   buffer_lost_the_delivery: bool) -> None:
    trainer_run = tmp_path / "trainer_run"                       # the buffer's folder holds no checkpoints
    core = buffer.open()
    fill_ready(core, 4)
    buffer.close()
    durable = tmp_path / "durable"
    shutil.copytree(buffer.dir, durable)                        # what a power loss under fsync: no keeps
    core = buffer.open()
    batch = core.get_batch(0, 2, 0, 0)                          # step 0 is trained, its checkpoint sealed...
    trained = sample_ids(batch)
    assert len(trained) == 4
    write_checkpoint(trainer_run, 0, trained)
    buffer.close()                                              # ...and the trainer stops before the Ack
    if buffer_lost_the_delivery:
        shutil.rmtree(buffer.dir)
        shutil.copytree(durable, buffer.dir)

    core = buffer.open()
    client = buffer.serve()
    assert report_resume(client, trainer_run, 0, allow_older=False) == 1
    assert report_resume(client, trainer_run, 0, allow_older=False) == 1     # a retried report changes nothing
    stats = client.stats()
    assert stats.committed_step == 0
    assert (stats.dropped.get("trained", 0), stats.acked_samples) == ((4, 0) if buffer_lost_the_delivery else (0, 4))
    buffer.close()
    core = buffer.open()                                        # durable: a restarted buffer agrees
    served = []
    for step in (1, 2):
        got = core.get_batch(step, 1, 0, 0)
        served += sample_ids(got)
    assert len(served) == 4 and not set(served) & set(trained)
    assert not core.state.ready and not core.state.open


def test_a_checkpoint_older_than_the_buffers_committed_step_is_refused(tmp_path: Path, buffer: Buffer) -> None:
    trainer_run = tmp_path / "trainer_run"
    core = buffer.open()
    fill_ready(core, 6)
    for step in range(3):
        got = core.get_batch(step, 1, 0, 0)
        write_checkpoint(trainer_run, step, sample_ids(got))
        core.ack(step)
    for step in (1, 2):                                         # the newer checkpoints are gone (hidden, deleted)
        shutil.rmtree(trainer_run / "checkpoints" / f"step_{step:08d}")
    before = fingerprint(core.state)
    client = buffer.serve()
    for checkpoint_step, named in ((0, "the checkpoint of step 0"), (-1, "no checkpoint")):
        with pytest.raises(PeerError) as err:
            report_resume(client, trainer_run, checkpoint_step, allow_older=False)
        text = str(err.value)
        assert "FAILED_PRECONDITION" in text and named in text and "every step through 2" in text
        assert "run.allow_older_checkpoint" in text
    assert fingerprint(core.state) == before
    buffer.close()
    core = buffer.open()
    assert fingerprint(core.state) == before                    # nothing acknowledged, dropped or lost on disk
    assert len(core.state.ready) == 3
    client = buffer.serve()
    assert report_resume(client, trainer_run, 0, allow_older=True) == 3      # the user's override: on after step 2
    assert fingerprint(core.state) == before
