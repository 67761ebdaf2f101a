"""The embedded store: state in the buffer process, durable as an append-only log in RUN_DIR/buffer/.

Each commit is ONE checksummed frame holding all its mutations (rlfleet.services.buffer.stores.logfile), so replay
applies a commit whole or not at all. Its first record is its sequence number (mutations.Seq: 0 for the log file's
first commit, then one more a commit; a compaction starts the new file at 0): replay refuses a commit whose number
is not exactly the next one, as a repeated frame (a copy of an earlier commit, never applied twice) or as missing
commits (LogCorrupt; `rlfleet buffer verify` reports it, `salvage` drops the copy). A log of the format before
sequence numbers (frames of mutations only) is replayed as it is, then rewritten in the current format on load, the
original kept beside it as buffer.log.unsequenced-N. Durability per `fsync`:
  always    (default) the reply waits until the commit is fsynced. Group commit: append() only writes (under the
            buffer's lock); sync() is called after the lock is released, and one fsync covers every commit written
            before it, so concurrent Puts share one fsync instead of queueing behind each other's. The log keeps
            zeros written ahead of its end (PREALLOCATE_BYTES), so most fsyncs flush data only, no file size.
  everysec  a background thread fsyncs once a second: a power loss (not a process crash) loses up to ~1 s of
            acknowledged Puts, deliveries and Acks.
  no        never fsynced by the buffer (the OS flushes): a power loss loses whatever the OS had not written.
On start the log is scanned: a torn tail (a bad last frame that looks like a write that did not finish, e.g.
zero-filled) is cut off, its bytes kept beside the log; a bad frame followed by intact ones, or a damaged complete
last commit, is corruption and load() refuses with a LogCorrupt naming the file and offset (`rlfleet buffer
verify|salvage RUN_DIR`). Then the log and its folder are fsynced before anything is served from them. When the
log grows well past the live data it is compacted: the state's snapshot is written to a temporary file, fsynced
and renamed over the log; a failed compaction leaves the old log serving and is retried later. An append that
meets a full disk compacts at once (when that frees space) and is written once more.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

from rlfleet.run_dir.atomic import fsync_dir, write_bytes_atomic
from rlfleet.services.buffer.mutations import Mutation, Record, Seq, decode, encode
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores import StoreError
from rlfleet.services.buffer.stores.logfile import (
    HEADER_BYTES,
    AppendLog,
    Scan,
    frame_parts,
    replace_with,
    scan_bytes,
)

_LEN = struct.Struct("<I")
LOG_NAME = "buffer.log"
PREALLOCATE_BYTES = 4 << 20     # zeros kept ahead of the log when every commit is fsynced (see AppendLog)
FSYNC_POLICIES = ("always", "everysec", "no")
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)   # EFBIG: past RLIMIT_FSIZE (how tests fill a disk)
log = logging.getLogger(__name__)


class LogCorrupt(StoreError):
    """The log holds damage that may have taken acknowledged commits (a bad frame with intact commits after it, a
    damaged complete last commit, a commit that does not replay): refused at once, never cut (see `rlfleet buffer
    verify`)."""


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of directory."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def free_name(path: Path, kind: str) -> Path:
    """path's name + .KIND-N for the first N not taken: where a copy of the log is kept before it is changed."""
    n = 0
    while path.with_name(f"{path.name}.{kind}-{n}").exists():
        n += 1
    return path.with_name(f"{path.name}.{kind}-{n}")


def keep_beside(path: Path, kind: str) -> Path:
    """Keep the file at path under a free .KIND-N name beside it (a hard link, so no copy), durably."""
    keep = free_name(path, kind)
    os.link(path, keep)
    fsync_dir(path.parent)
    return keep


def _body_parts(m: Record) -> list[bytes]:
    """One mutation record as [header length, JSON header, payload]: a sample's bytes are written, never copied."""
    header, payload = encode(m)
    return [_LEN.pack(len(header)), header, payload]


def _body(m: Record) -> bytes:
    return b"".join(_body_parts(m))


def _parse(body: bytes | memoryview) -> Record:
    (n,) = _LEN.unpack_from(body)
    return decode(bytes(body[_LEN.size:_LEN.size + n]), bytes(body[_LEN.size + n:]))


def _mutation(record: Record) -> Mutation:
    if isinstance(record, Seq):
        raise ValueError("a sequence number that is not its commit's first record")
    return record


def commit_parts(mutations: list[Mutation], seq: int) -> list[bytes]:
    """The body of commit number seq of its log: its Seq record, then each mutation record, each prefixed by its
    length, as buffers in order."""
    out: list[bytes] = []
    for m in [Seq(seq), *mutations]:
        parts = _body_parts(m)
        out.append(_LEN.pack(sum(len(p) for p in parts)))
        out.extend(parts)
    return out


def _records(body: bytes) -> Iterator[memoryview]:
    view, pos = memoryview(body), 0
    while pos < len(view):
        if len(view) - pos < _LEN.size:
            raise ValueError(f"{len(view) - pos} stray bytes at the end of a commit")
        (n,) = _LEN.unpack_from(view, pos)
        if pos + _LEN.size + n > len(view):
            raise ValueError(f"a record of {n} bytes runs past the end of its commit")
        yield view[pos + _LEN.size:pos + _LEN.size + n]
        pos += _LEN.size + n


def read_commit(body: bytes) -> tuple[int | None, list[Mutation]]:
    """(sequence number, mutations) of one commit frame's body; None for a commit of the format before sequence
    numbers. Raises ValueError (and the decoders' errors) on a bad body."""
    records = [_parse(r) for r in _records(body)]
    if records and isinstance(records[0], Seq):
        return records[0].n, [_mutation(r) for r in records[1:]]
    return None, [_mutation(r) for r in records]


def read_frame(body: bytes, legacy: bool) -> tuple[int | None, list[Mutation]]:
    """read_commit, or for a log of the format before commit frames (legacy) the one mutation of its frame."""
    return (None, [_mutation(_parse(body))]) if legacy else read_commit(body)


def decode_commit(body: bytes) -> list[Mutation]:
    """The mutations of one commit frame's body. Raises ValueError (and the decoders' errors) on a bad body."""
    return read_commit(body)[1]


def first_seq(result: Scan) -> int | None:
    """The sequence number of the log's first commit (reads its first record only); None for an empty log or one of
    a format before sequence numbers."""
    if result.legacy or not result.frames:
        return None
    first = next(_records(result.frames[0][1]), None)
    record = _parse(first) if first is not None else None
    return record.n if isinstance(record, Seq) else None


def sequence_fault(result: Scan, index: int, seq: int | None, sequenced: bool) -> str:
    """Why commit number index of the scan (sequence number seq) may not be applied next; "" when it may. In a log
    of sequence numbers the commit at index i is number i (a file's first commit is 0); in a log of the format
    before them (sequenced False) no commit has one."""
    if not sequenced:
        return "" if seq is None else f"a commit numbered {seq} in a log of the format without sequence numbers"
    offset = result.frames[index][0]
    if seq is None:
        return f"the commit at offset {offset} has no sequence number (expected {index})"
    if seq < index:
        return (f"the commit at offset {offset} repeats commit {seq} (at offset {result.frames[seq][0]}): a "
                f"duplicated frame, never applied twice")
    if seq > index:
        missing = f"commit {index} is" if seq == index + 1 else f"commits {index}..{seq - 1} are"
        return f"the commit at offset {offset} is number {seq} where {index} was next: {missing} missing"
    return ""


def replay(result: Scan) -> State:
    """The state the intact commits of a scan rebuild. LogCorrupt naming file and offset on a record that does not
    decode or does not apply (a checksum-valid frame the code cannot read: a bug or a foreign file, never cut), or
    on a commit whose sequence number is not the next one (a repeated frame, or missing commits: never applied)."""
    state, sequenced = State(), first_seq(result) is not None
    for index, (offset, body) in enumerate(result.frames):
        try:
            seq, muts = read_frame(body, result.legacy)
        except Exception as exc:   # a decoder error: reported as the store's, with its place
            raise LogCorrupt(f"{result.path}: commit at offset {offset} cannot be replayed: "
                             f"{type(exc).__name__}: {exc}") from exc
        fault = sequence_fault(result, index, seq, sequenced)
        if fault:
            raise LogCorrupt(f"{result.path}: {fault}")
        try:
            for m in muts:
                state.apply(m)
        except Exception as exc:   # a State.apply error: reported as the store's, with its place
            raise LogCorrupt(f"{result.path}: commit at offset {offset} cannot be replayed: "
                             f"{type(exc).__name__}: {exc}") from exc
    return state


class EmbeddedStore:
    """Append-only log of commit frames with replay, torn-tail repair, group commit and compaction."""

    def __init__(self, directory: Path, fsync: str = "always", compact_min_bytes: int = 64 << 20) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be always, everysec or no, not {fsync!r}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / LOG_NAME
        self.fsync = fsync
        self.compact_min_bytes = compact_min_bytes
        self._log: AppendLog | None = None
        self._live_bytes = 0
        self._compact_after = 0            # log size a compaction is next tried at (after a failed one: later)
        self._compact_failed: tuple[int, int] | None = None   # (free disk bytes, log size) at a failure for space
        self._failed_bytes = 0             # size of the last commit that could not be written
        self._next_seq = 0                 # the sequence number of the next commit written to the log file
        # group commit: byte counters over the store's life (never reset, so tokens outlive compactions)
        self._cv = threading.Condition()
        self._appended = 0                 # bytes written
        self._durable = 0                  # bytes known fsynced
        self._suspect = 0                  # an fsync failed with this much written: those bytes may be lost
        self._busy = False                 # an fsync (or a file swap) is in progress
        self.failure: str | None = None    # the last append/sync error, until a later one succeeds
        self.fsyncs = 0                    # fsync calls made (group commit shares them)
        self.synced_size = 0               # log file size at the last fsync that succeeded (what a power loss keeps)
        self._preallocate = PREALLOCATE_BYTES if fsync == "always" else 0
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None

    # ---- load ----------------------------------------------------------------------------------------------------
    def load(self) -> State:
        with self._exclusive():
            if self._log is not None:
                self._log.close()
                self._log = None
            data = self.path.read_bytes() if self.path.exists() else b""
            result = scan_bytes(self.path, data)
            if result.damage is not None and not result.damage.torn_tail:
                raise LogCorrupt(f"{result.describe()}; refusing to start: run `rlfleet buffer verify` / "
                                 f"`rlfleet buffer salvage` on the run folder")
            state = replay(result)
            unsequenced = bool(result.frames) and first_seq(result) is None
            try:
                if result.damage is not None:
                    kept = self._keep_tail(data[result.damage.offset:])
                    log.warning("%s; cut off%s", result.describe(), f" (its bytes kept as {kept})" if kept else "")
                if unsequenced:
                    kind = "legacy" if result.legacy else "unsequenced"
                    kept = keep_beside(self.path, kind)
                    log.warning("%s: old log format (%s); rewriting it as numbered commit frames (the original kept "
                                "as %s)", self.path, kind, kept)
                    self._log = replace_with(self.path, self._snapshot_frames(state), self._preallocate)
                    self._next_seq = 1
                else:
                    self._log = AppendLog(self.path, result.end, preallocate=self._preallocate)
                    self._next_seq = len(result.frames)
                    # what a killed process wrote is only in the page cache: make it durable before anything is
                    # served or acknowledged from it (a retried Put answered as a duplicate, a re-asked batch)
                    self._log.fsync()
                    fsync_dir(self.dir)
            except OSError as exc:
                raise StoreError(f"buffer log {self.path}: {exc}") from exc
            self._live_bytes = self.synced_size = self._log.size   # fsynced above (replace_with fsyncs its file)
            self._compact_after = max(self.compact_min_bytes, 4 * self._live_bytes)
            self._appended = self._durable = self._suspect = max(self._appended, self._suspect)
        if self.fsync == "everysec" and self._syncer is None:
            self._syncer = threading.Thread(target=self._sync_loop, name="buffer-fsync", daemon=True)
            self._syncer.start()
        return state

    def _keep_tail(self, tail: bytes) -> Path | None:
        """Keep the bytes of a torn tail beside the log before it is cut (unless they are only zeros)."""
        tail = tail.rstrip(b"\0")
        if not tail:
            return None
        path = free_name(self.path, "torn")
        write_bytes_atomic(path, tail)
        return path

    @property
    def log_bytes(self) -> int:
        """Bytes of commits in the log (the file may hold preallocated zeros after them)."""
        return self._log.size if self._log is not None else 0

    # ---- commit --------------------------------------------------------------------------------------------------
    def append(self, mutations: list[Mutation], state: State) -> int:
        """Write one commit (state: before it is applied); returns the token to sync(). Callers serialize appends."""
        assert self._log is not None, "load() first"
        if self._log.size > self._compact_after and self._space_freed():
            self._try_compact(state)
        before, buffers = self._log.size, frame_parts(commit_parts(mutations, self._next_seq))
        try:
            try:
                self._log.append_buffers(buffers)
            except OSError as exc:       # cut back: the zeros written ahead of the log are given back too
                if exc.errno not in DISK_FULL or not self._compact_on_disk_full(state):
                    raise
                before, buffers = self._log.size, frame_parts(commit_parts(mutations, self._next_seq))
                self._log.append_buffers(buffers)          # once more, into the compacted log (numbered after it)
        except OSError as exc:
            self.failure = f"buffer log {self.path}: {exc}"
            self._failed_bytes = sum(len(b) for b in buffers)
            raise StoreError(self.failure) from exc
        self._next_seq += 1
        with self._cv:
            self._appended += self._log.size - before
            if self.fsync != "always" and self._appended > self._suspect:
                self.failure = None         # nothing waits for an fsync: a write that succeeds is health
            return self._appended

    def sync(self, token: int) -> None:
        """Return once every commit up to token is durable (per the fsync policy). One fsync serves every waiter
        whose commit was written before it started. StoreError if an fsync failed with that commit written."""
        if self.fsync != "always":
            return
        with self._cv:
            while self._durable < token:
                if token <= self._suspect:
                    raise StoreError(self.failure or f"buffer log {self.path}: an fsync failed")
                if self._busy:
                    self._cv.wait()
                    continue
                self._fsync_locked()

    def _fsync_locked(self) -> None:
        """fsync as the leader: called with _cv held and not busy; releases it during the fsync."""
        target, log_ = self._appended, self._log
        size = log_.size if log_ is not None else 0
        if log_ is None:
            raise StoreError(f"buffer log {self.path}: closed")
        self._busy = True
        self._cv.release()
        error: OSError | None = None
        try:
            log_.fsync()
        except OSError as exc:
            error = exc
        finally:
            self._cv.acquire()
            self._busy = False
            self.fsyncs += 1
            self._cv.notify_all()
        if error is not None:
            self._suspect = max(self._suspect, target)
            self.failure = f"buffer log {self.path}: fsync: {error}"
            raise StoreError(self.failure) from error
        self._durable = max(self._durable, target)
        if log_ is self._log:
            self.synced_size = max(self.synced_size, size)
        if target > self._suspect:
            self.failure = None

    def commit(self, mutations: list[Mutation], state: State) -> None:
        """append + sync: durable (per the policy) when it returns."""
        self.sync(self.append(mutations, state))

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """No fsync runs inside: for swapping or closing the file."""
        with self._cv:
            while self._busy:
                self._cv.wait()
            self._busy = True
        try:
            yield
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    # ---- health --------------------------------------------------------------------------------------------------
    def healthy(self) -> bool:
        return self.failure is None

    def probe(self) -> bool:
        """After a failure: can the log take the commit that failed? Room for it is written (zeros ahead of the
        log, where the next commit goes without growing the file), then an empty commit and its fsync (callers
        serialize it with append). True if healthy: an empty commit alone fits where a real one does not."""
        if self.failure is None:
            return True
        if self._log is None:                 # a reload failed: the next call loads again
            return False
        try:
            self._log.reserve(self._log.size + HEADER_BYTES + max(self._failed_bytes, HEADER_BYTES))
        except OSError:
            return False
        try:
            self.commit([], State())
        except StoreError:
            return False
        return self.failure is None

    # ---- compaction ----------------------------------------------------------------------------------------------
    def _snapshot_frames(self, state: State) -> list[bytes]:
        """The snapshot of state as the first commit (number 0) of a new log file."""
        return frame_parts(commit_parts(state.snapshot(), 0))

    def compact(self, state: State, frames: list[bytes] | None = None) -> None:
        """Rewrite the log as the snapshot of state (which must equal the log's content; frames: that snapshot's,
        if already made). On error the old log is untouched and keeps serving."""
        assert self._log is not None
        frames = self._snapshot_frames(state) if frames is None else frames
        with self._exclusive():
            new = replace_with(self.path, frames, self._preallocate)
            old, self._log = self._log, new
            self._next_seq = 1
            old.close()
            with self._cv:
                self._durable = self._appended       # everything so far is in the fsynced snapshot
                self.synced_size = new.size
        self._live_bytes = new.size
        self._compact_after = max(self.compact_min_bytes, 4 * self._live_bytes)
        self._compact_failed = None

    def _try_compact(self, state: State) -> None:
        try:
            self.compact(state)
        except OSError as exc:
            assert self._log is not None
            if exc.errno in DISK_FULL:      # the log cannot grow to a later retry point: retry when it grows again
                self._compact_after = self._log.size
                self._compact_failed = (free_bytes(self.dir), self._log.size)
            else:
                self._compact_after = self._log.size + max(self.compact_min_bytes, self._live_bytes)
            log.warning("buffer log %s: compaction failed (%s); the old log keeps serving, retried at %d bytes",
                        self.path, exc, self._compact_after)

    def _compact_on_disk_full(self, state: State) -> bool:
        """An append met a full disk (and gave back the zeros written ahead): compact at once if the snapshot is
        smaller than the log, unless a compaction already failed for space and none was freed since. True if the
        log was compacted."""
        assert self._log is not None
        frames = self._snapshot_frames(state)
        if sum(len(b) for b in frames) >= self._log.size:
            return False
        if not self._space_freed():
            return False
        free = free_bytes(self.dir)
        try:
            self.compact(state, frames)
        except OSError as exc:
            self._compact_failed = (free, self._log.size)
            log.warning("buffer log %s: the disk is full and compaction failed too (%s); retried when space is "
                        "freed", self.path, exc)
            return False
        log.warning("buffer log %s: the disk is full; compacted to %d bytes", self.path, self._log.size)
        return True

    def _space_freed(self) -> bool:
        """After a compaction failed for lack of space: True once the disk has more free space than then, or (a
        quota or file size limit statvfs does not show) the log grew by another compaction step since."""
        if self._compact_failed is None:
            return True
        free, size = self._compact_failed
        return free_bytes(self.dir) > free or self.log_bytes >= size + max(self.compact_min_bytes, self._live_bytes)

    # ---- background fsync (everysec) and close ---------------------------------------------------------------------
    def _sync_loop(self) -> None:
        while not self._stop.wait(1.0):
            with self._cv:
                if self._durable < self._appended and not self._busy and self._log is not None:
                    with contextlib.suppress(StoreError):
                        self._fsync_locked()

    def close(self) -> None:
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()
            self._syncer = None
        with self._exclusive():
            if self._log is not None:
                if self.fsync != "no":
                    with contextlib.suppress(OSError):
                        self._log.fsync()
                self._log.close()
                self._log = None
