"""The embedded store under the faults a long job meets: power loss, torn commits, flipped bits, zero-filled tails,
undecodable records, a disk that fills up. Each test drives a real BufferCore over a real log file."""

from __future__ import annotations

import json
import os
import resource
import struct
import threading
import zlib
from pathlib import Path

import pytest

from rlfleet.cli import main as rlfleet_main
from rlfleet.config import BufferConfig, load_config
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import build_core
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores import StoreError
from rlfleet.services.buffer.stores.embedded import LOG_NAME, PREALLOCATE_BYTES, EmbeddedStore
from tests.integration.test_buffer_contract import make_sample
from tests.integration.test_buffer_service import write_config
from tests.support.redis_server import free_port

SETTINGS = BufferSettings(capacity=4096, group_size=2, groups_per_step=1, steps=1000, max_staleness=1000,
                          lease_seconds=600.0, min_valid_per_group=1)


def fingerprint(state: State) -> tuple:
    """Everything a reloaded state must agree on (written here, not taken from the code under test)."""
    def samples(g: object) -> tuple:
        return tuple(sorted((i, e.seq, e.data) for i, e in g.samples.items()))  # type: ignore[attr-defined]

    return (tuple((gid, g.prompt_index, samples(g)) for gid, g in sorted(state.open.items())),
            tuple((gid, g.kept, g.ready_seq, samples(g)) for gid, g in state.ready.items()),
            tuple(sorted((gid, samples(g)) for gid, g in state.delivered.items())),
            tuple(sorted((s, b.gids) for s, b in state.batches.items())),
            state.next_prompt_index, state.seq, state.put_samples, state.acked_samples, state.committed_step,
            tuple(sorted(state.dropped.items())))


def run_steps(core: BufferCore, groups: int) -> None:
    """Claim, fill and close `groups` groups; deliver and ack every other one."""
    for _ in range(groups):
        (t,) = core.claim("r", 0, 1, 0).tickets
        core.put([make_sample(t.group_id, i, 2) for i in range(2)], 0)
    step = core.state.committed_step + 1 + len(core.state.batches)
    while len(core.state.ready) >= 2:
        core.get_batch(step, 1, 0, 0)
        core.ack(step)
        step += 1


def fill_ready(core: BufferCore, groups: int) -> None:
    """`groups` ready groups, each filled by one Put (one commit)."""
    for _ in range(groups):
        (t,) = core.claim("r", 0, 1, 0).tickets
        core.put([make_sample(t.group_id, i, 2) for i in range(2)], 0)
    assert len(core.state.ready) == groups


def open_core(directory: Path, **kw: object) -> BufferCore:
    return BufferCore(EmbeddedStore(directory, **kw), SETTINGS)  # type: ignore[arg-type]


def test_acknowledged_means_fsynced_and_concurrent_puts_share_fsyncs(tmp_path: Path) -> None:
    """The default store fsyncs before a reply (power loss keeps every acknowledged Put), and 8 concurrent Puts
    share fsyncs (group commit) instead of paying one each."""
    assert BufferConfig().fsync == "always"
    store = EmbeddedStore(tmp_path)
    core = BufferCore(store, SETTINGS)
    tickets = core.claim("r", 0, 160, 0).tickets
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def producer(k: int) -> None:
        try:
            for t in tickets[k::8]:
                barrier.wait()
                samples = [make_sample(t.group_id, i, 2) for i in range(2)]
                start = store.log_bytes                 # the file also holds the zeros written ahead of it
                core.put(samples, 0)
                # the reply came: this Put's commit (written after `start`, holding both samples) is fsynced
                mine = sum(len(s.SerializeToString()) for s in samples)
                assert store.synced_size >= start + mine
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(8)]
    before = store.fsyncs
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    puts = len(tickets)
    assert 0 < store.fsyncs - before < puts
    # power loss: the log cut back to its last fsync keeps every acknowledged sample
    core.close()
    survived = EmbeddedStore(tmp_path).load()
    assert len(survived.ready) == puts and survived.put_samples == 2 * puts


def test_everysec_is_named_for_what_it_loses() -> None:
    field = BufferConfig.model_fields["fsync"]
    assert field.default == "always"
    source = Path(__file__).parents[2].joinpath("rlfleet", "config", "buffer.py").read_text()
    assert "everysec: loses up to ~1 s of acknowledged samples" in source


def _last_commit_bounds(tmp_path: Path) -> tuple[bytes, int, int]:
    """A log whose last commit is a Put that completes a group (its samples and its close), and that commit's range."""
    core = open_core(tmp_path)
    run_steps(core, 5)
    (t,) = core.claim("r", 0, 1, 0).tickets
    core.put([make_sample(t.group_id, 0, 2)], 0)
    assert isinstance(core.store, EmbeddedStore)
    start = core.store.log_bytes                       # (the live file also holds zeros written ahead of the log)
    core.put([make_sample(t.group_id, 1, 2)], 0)       # completes the group: samples + close in one commit
    core.close()
    data = (tmp_path / LOG_NAME).read_bytes()
    return data, start, len(data)


def test_every_truncation_of_the_last_commit_reloads_before_or_after(tmp_path: Path) -> None:
    data, start, end = _last_commit_bounds(tmp_path / "src")
    before = fingerprint(_load_bytes(tmp_path / "b", data[:start]))
    after = fingerprint(_load_bytes(tmp_path / "c", data))
    assert before != after
    outcomes = {"before": 0, "after": 0}
    for cut in range(start, end + 1):
        for tail in (b"", b"\0" * (end - cut)):           # torn, and torn then zero-filled by the filesystem
            got = fingerprint(_load_bytes(tmp_path / f"t{cut}-{len(tail)}", data[:cut] + tail))
            assert got in (before, after), f"truncated at {cut} (+{len(tail)} zero bytes): neither state"
            outcomes["before" if got == before else "after"] += 1
    assert outcomes["after"] == 2 and outcomes["before"] == 2 * (end - start + 1) - 2
    print(f"\ntruncation offsets tried: {end - start + 1} (x2 with zero fill); outcomes {outcomes}")


def _load_bytes(directory: Path, data: bytes) -> State:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / LOG_NAME).write_bytes(data)
    store = EmbeddedStore(directory)
    try:
        return store.load()
    finally:
        store.close()


def test_the_log_writes_zeros_ahead_and_a_crash_with_them_keeps_every_commit(tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """fsync always keeps zeros written past the log's end (so an fsync has no file size to journal): a crash that
    leaves them (the live file, copied) reloads every commit, and a clean close cuts them off."""
    core = open_core(tmp_path / "live")
    run_steps(core, 6)
    want = fingerprint(core.state)
    store = core.store
    assert isinstance(store, EmbeddedStore)
    data = (tmp_path / "live" / LOG_NAME).read_bytes()
    assert len(data) >= store.log_bytes + PREALLOCATE_BYTES // 2
    assert data[store.log_bytes:] == bytes(len(data) - store.log_bytes)
    with caplog.at_level("WARNING"):
        assert fingerprint(_load_bytes(tmp_path / "crashed", data)) == want
    assert "zeros" in caplog.text
    assert (tmp_path / "crashed" / LOG_NAME).stat().st_size < PREALLOCATE_BYTES // 2   # closed: cut to the log
    log_bytes = store.log_bytes
    core.close()
    assert (tmp_path / "live" / LOG_NAME).stat().st_size == log_bytes
    assert fingerprint(open_core(tmp_path / "live").state) == want
    other = EmbeddedStore(tmp_path / "everysec", fsync="everysec")       # zeros buy nothing without an fsync a commit
    other.commit([], other.load())
    assert (tmp_path / "everysec" / LOG_NAME).stat().st_size == other.log_bytes
    other.close()


def test_a_zero_filled_tail_is_cut_and_the_buffer_starts(tmp_path: Path) -> None:
    core = open_core(tmp_path)
    run_steps(core, 3)
    want = fingerprint(core.state)
    core.close()
    with (tmp_path / LOG_NAME).open("ab") as f:
        f.write(b"\0" * 4096)
    core = open_core(tmp_path)
    assert fingerprint(core.state) == want
    run_steps(core, 1)                                  # the cut log takes appends again
    want = fingerprint(core.state)
    core.close()
    assert fingerprint(open_core(tmp_path).state) == want


def _flip_mid_log(path: Path) -> int:
    """Flip one bit inside a sample record of an early commit (its type name); returns the byte offset flipped."""
    data = bytearray(path.read_bytes())
    at = data.index(b'"t":"Add"', len(data) // 5) + 5     # the A of a record a fifth into the log
    data[at] ^= 0x10
    path.write_bytes(bytes(data))
    return at


def test_a_flipped_bit_mid_log_is_refused_with_file_and_offset(tmp_path: Path) -> None:
    core = open_core(tmp_path)
    fill_ready(core, 20)
    core.close()
    size = (tmp_path / LOG_NAME).stat().st_size
    _flip_mid_log(tmp_path / LOG_NAME)
    with pytest.raises(StoreError, match=r"buffer\.log: corrupt frame at offset \d+") as info:
        open_core(tmp_path)
    assert "intact frames" in str(info.value)
    assert (tmp_path / LOG_NAME).stat().st_size == size        # nothing cut


def test_verify_and_salvage_recover_the_intact_commits(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    core = open_core(run_dir / "buffer")
    fill_ready(core, 20)
    core.close()
    assert rlfleet_main(["buffer", "verify", str(run_dir)]) == 0
    _flip_mid_log(run_dir / "buffer" / LOG_NAME)
    assert rlfleet_main(["buffer", "verify", str(run_dir)]) == 1
    assert "corrupt frame at offset" in capfd.readouterr().out
    assert rlfleet_main(["buffer", "salvage", str(run_dir)]) == 0
    out = capfd.readouterr().out
    assert "salvaged" in out and (run_dir / "buffer" / f"{LOG_NAME}.corrupt-0").exists()
    state = open_core(run_dir / "buffer").state
    assert len(state.ready) == 19 and state.next_prompt_index == 20   # only the damaged group's commit is gone


def test_an_undecodable_record_is_a_store_error_naming_its_offset(tmp_path: Path) -> None:
    """A checksum-valid frame whose body is not a commit (written by hand: magic, length, crc(length+body))."""
    core = open_core(tmp_path)
    run_steps(core, 2)
    core.close()
    body = struct.pack("<I", 7) + b"garbage"
    length = struct.pack("<I", len(body))
    offset = (tmp_path / LOG_NAME).stat().st_size
    with (tmp_path / LOG_NAME).open("ab") as f:
        f.write(b"RLFC" + length + struct.pack("<I", zlib.crc32(body, zlib.crc32(length))) + body)
    with pytest.raises(StoreError, match=rf"commit at offset {offset} cannot be replayed"):
        open_core(tmp_path)


class FileSizeLimit:
    """RLIMIT_FSIZE for this process: a write past `limit` bytes fails with EFBIG, as a full disk fails (Python
    ignores SIGXFSZ). Lifted on exit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __enter__(self) -> FileSizeLimit:
        self.old = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.old[1]))
        return self

    def __exit__(self, *exc: object) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, self.old)


def test_a_failed_compaction_keeps_the_old_log_serving(tmp_path: Path) -> None:
    core = open_core(tmp_path, compact_min_bytes=1)
    run_steps(core, 4)
    blocker = tmp_path / f".{LOG_NAME}.tmp{os.getpid()}"
    blocker.mkdir()                                  # the compaction's temporary file cannot be created
    run_steps(core, 4)                               # every commit tries to compact, fails, and appends anyway
    assert core.store.healthy()
    blocker.rmdir()
    run_steps(core, 1)                               # compacts now
    want = fingerprint(core.state)
    core.close()
    assert fingerprint(open_core(tmp_path).state) == want


def test_a_full_disk_fails_calls_then_recovers_when_space_returns(tmp_path: Path) -> None:
    core = open_core(tmp_path, compact_min_bytes=1)
    run_steps(core, 4)
    want = fingerprint(core.state)
    (t,) = core.claim("r", 0, 1, 0).tickets
    want = fingerprint(core.state)
    store = core.store
    assert isinstance(store, EmbeddedStore)
    size = store.log_bytes                           # (the file goes on with zeros written ahead of the log)
    with FileSizeLimit(size // 4):                   # the snapshot and the append both fail
        with pytest.raises(StoreError, match="buffer log"):
            core.put([make_sample(t.group_id, i, 2) for i in range(2)], 0)
        assert not core.healthy()
        assert fingerprint(core.store.load()) == want   # nothing half-written
    assert core.healthy()                            # the probe sees the disk back
    core.put([make_sample(t.group_id, i, 2) for i in range(2)], 0)
    run_steps(core, 2)
    want = fingerprint(core.state)
    core.close()
    assert fingerprint(open_core(tmp_path).state) == want


def test_a_full_disk_takes_commits_into_the_zeros_left_then_fails(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The zeros written ahead of the log are allocated space: when the disk fills, commits go on into them (one
    warning that no more could be written), and the first commit that needs more fails without a half frame."""
    core = open_core(tmp_path)
    run_steps(core, 2)
    store = core.store
    assert isinstance(store, EmbeddedStore)
    file_size = (tmp_path / LOG_NAME).stat().st_size
    room = file_size - store.log_bytes
    assert room >= PREALLOCATE_BYTES // 2
    with FileSizeLimit(file_size), caplog.at_level("WARNING"):
        (t,) = core.claim("r", 0, 1, 0).tickets
        big = [make_sample(t.group_id, i, 2, tokens=room // 15) for i in range(2)]   # ~60 % of the room each
        core.put(big[:1], 0)                       # fits; the refill after it cannot be written
        assert core.healthy() and "cannot write zeros ahead of the log" in caplog.text
        want = fingerprint(core.state)
        (u,) = core.claim("r", 0, 1, 0).tickets     # small: still fits in what is left
        want = fingerprint(core.state)
        with pytest.raises(StoreError, match="buffer log"):       # needs more than the room: fails whole
            core.put([make_sample(u.group_id, i, 2, tokens=room // 10) for i in range(2)], 0)
        assert fingerprint(core.store.load()) == want     # nothing half-written
    core.put(big[1:], 0)                             # space returned
    assert core.healthy()
    want = fingerprint(core.state)
    core.close()
    assert fingerprint(open_core(tmp_path).state) == want


def _checkpoint(run_dir: Path, step: int, ids_per_rank: list[list[str]]) -> None:
    """A complete checkpoint folder as the trainer leaves it (meta.json, checksums.json, committed ids per rank)."""
    path = run_dir / "checkpoints" / f"step_{step:08d}"
    path.mkdir(parents=True)
    sums = {}
    for rank, ids in enumerate(ids_per_rank):
        name = f"committed_ids_rank{rank:05d}.json"
        (path / name).write_text(json.dumps(ids))
        sums[name] = {"bytes": (path / name).stat().st_size}
    (path / "meta.json").write_text(json.dumps({"step": step, "version": step + 1, "world_size": len(ids_per_rank)}))
    (path / "checksums.json").write_text(json.dumps(sums))


def test_samples_a_checkpoint_committed_are_never_delivered_again(tmp_path: Path) -> None:
    """The store lost its Deliver and Ack records (power loss under everysec): g0 and g1 are ready again though the
    trainer's checkpoint at step 1 committed them. On start the buffer reads the committed ids back and drops them."""
    run_dir = tmp_path / "run"
    port = free_port()
    cfg = load_config(write_config(run_dir, port, fsync="everysec"))
    core = build_core(cfg)
    fill_ready(core, 3)
    (t,) = core.claim("r", 0, 1, 0).tickets                   # g3: open, its sample 0 was trained too
    core.put([make_sample(t.group_id, 0, 2)], 0)
    core.close()
    _checkpoint(run_dir, 1, [["g0/0", "g0/1", "g3/0"], ["g1/0", "g1/1"]])
    _checkpoint(tmp_path / "elsewhere", 0, [["g2/0"]])        # another run's: not read
    core = build_core(cfg)
    assert list(core.state.ready) == ["g2"] and "g3" not in core.state.open
    assert core.state.dropped == {"trained": 5}
    batch = core.get_batch(0, 1, 0, 0)
    assert batch.group_ids == ["g2"]
    assert core.put([make_sample("g3", 1, 2)], 0).cancelled == 1   # a late put of the dropped group is not stored
    core.close()
    core = build_core(cfg)                                     # read again on the next start: nothing more to drop
    assert core.state.dropped == {"trained": 5, "aborted": 1} and list(core.state.batches) == [0]
    core.close()
