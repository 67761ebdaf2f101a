"""The embedded store: state in the buffer process, durable as an append-only log in RUN_DIR/buffer/.

Each commit appends its mutations as checksummed records in one write, then fsyncs per policy: `always` before
returning, `everysec` from a background thread, `no` never (the OS flushes). On start the log is replayed; a torn
last record (a crash mid-write) is cut off. When the log grows well past the live data it is compacted: the state's
snapshot is written to a temporary file, fsynced and renamed over the log (rlfleet.atomic).
"""

from __future__ import annotations

import struct
import threading
from pathlib import Path

from rlfleet.atomic import write_bytes_atomic
from services.buffer.mutations import Mutation, decode, encode
from services.buffer.state import State
from services.buffer.stores import StoreError
from services.buffer.stores.logfile import AppendLog, frame_parts, iter_frames, read_records

_LEN = struct.Struct("<I")
LOG_NAME = "buffer.log"


def _body(m: Mutation) -> bytes:
    return b"".join(_body_parts(m))


def _body_parts(m: Mutation) -> list[bytes]:
    """The record body as [header length, JSON header, payload]: a sample's bytes are written, never copied here."""
    header, payload = encode(m)
    return [_LEN.pack(len(header)), header, payload]


def _parse(body: bytes) -> Mutation:
    (n,) = _LEN.unpack_from(body)
    return decode(body[_LEN.size:_LEN.size + n], body[_LEN.size + n:])


class EmbeddedStore:
    """Append-only checksummed log with replay, torn-tail repair and compaction."""

    def __init__(self, directory: Path, fsync: str = "everysec", compact_min_bytes: int = 64 << 20) -> None:
        if fsync not in ("always", "everysec", "no"):
            raise ValueError(f"fsync must be always, everysec or no, not {fsync!r}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / LOG_NAME
        self.fsync = fsync
        self.compact_min_bytes = compact_min_bytes
        self._log: AppendLog | None = None
        self._live_bytes = 0
        self._dirty = False
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None

    def load(self) -> State:
        if self._log is not None:
            self._log.close()
        bodies, valid = read_records(self.path)
        state = State()
        for body in bodies:
            state.apply(_parse(body))
        self._log = AppendLog(self.path, valid)
        self._live_bytes = valid
        if self.fsync == "everysec" and self._syncer is None:
            self._syncer = threading.Thread(target=self._sync_loop, name="buffer-fsync", daemon=True)
            self._syncer.start()
        return state

    def commit(self, mutations: list[Mutation], state: State) -> None:
        assert self._log is not None, "load() first"
        try:
            if self._log.size > max(self.compact_min_bytes, 4 * self._live_bytes):
                self.compact(state)
            self._log.append_buffers([buf for m in mutations for buf in frame_parts(_body_parts(m))])
            if self.fsync == "always":
                self._log.fsync()
            else:
                self._dirty = True
        except OSError as exc:
            raise StoreError(f"buffer log {self.path}: {exc}") from exc

    def compact(self, state: State) -> None:
        """Rewrite the log as the snapshot of state (which must equal the log's content)."""
        assert self._log is not None
        data = b"".join(iter_frames([_body(m) for m in state.snapshot()]))
        self._log.close()
        write_bytes_atomic(self.path, data)
        self._log = AppendLog(self.path, len(data))
        self._live_bytes = len(data)

    def _sync_loop(self) -> None:
        while not self._stop.wait(1.0):
            self._sync_now()

    def _sync_now(self) -> None:
        log = self._log
        if self._dirty and log is not None:
            self._dirty = False
            try:
                log.fsync()
            except OSError:
                self._dirty = True

    def close(self) -> None:
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()
        if self._log is not None:
            if self.fsync != "no":
                self._log.fsync()
            self._log.close()
            self._log = None
