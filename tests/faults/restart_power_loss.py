"""kill -9, restart, then power loss: what the restarted buffer serves or acknowledges must survive the power loss.

A buffer killed between writing a commit and its fsync leaves that commit in the page cache only. The restarted
buffer reads it back and serves it (a re-asked batch) or acknowledges it (a retried Put answered as a duplicate);
a power loss then keeps only what was fsynced. So the restarted store must make what it read durable before it
serves from it.

One seeded case (run_case):
  1. a writer subprocess opens the embedded store (fsync always), commits a seeded number of groups (each commit
     acknowledged: fsynced), saves the log's bytes (what a power loss keeps: the durable image), appends a seeded
     number of further commits without their fsync, and SIGKILLs itself;
  2. this process restarts the store on the log (in-process) and records the state it would serve, watching every
     fsync of the log's file (os.fsync wrapped: the real call, then a copy of the file as it was made durable);
  3. power loss: the log is replaced by its bytes at the last fsync (in step 2, else the writer's durable image),
     and the store is opened once more: it must hold everything step 2 served.
python -m tests.faults.restart_power_loss --seeds 20 runs more cases.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rlfleet.services.buffer.mutations import Add, Close, Issue, Mutation
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores.embedded import LOG_NAME, EmbeddedStore

if TYPE_CHECKING:
    from _typeshed import HasFileno

DURABLE = "durable.bin"      # beside the store's folder: the log's bytes when its last acknowledged commit returned


def group(rng: random.Random, index: int) -> list[Mutation]:
    """One group's commit: issued, its samples added, closed (what a Put that completes a group writes)."""
    gid, size = f"g{index}", rng.randint(1, 3)
    muts: list[Mutation] = [Issue(gid, index, size, 1e9, "r")]
    muts += [Add(gid, i, 10 * index + i, 0, 1, rng.random(), rng.randbytes(rng.randint(1, 300))) for i in range(size)]
    return [*muts, Close(gid, tuple(range(size)), 10 * index + size, {}, ())]


def write_then_die(directory: Path, seed: int) -> None:
    """Step 1, in the writer subprocess: never returns."""
    rng = random.Random(seed)
    store = EmbeddedStore(directory, fsync="always")
    state = store.load()
    synced, unsynced = rng.randint(0, 3), rng.randint(1, 3)
    for i in range(synced):
        muts = group(rng, i)
        store.commit(muts, state)                    # acknowledged: fsynced before it returns
        for m in muts:
            state.apply(m)
    (directory.parent / DURABLE).write_bytes((directory / LOG_NAME).read_bytes())
    for i in range(synced, synced + unsynced):
        muts = group(rng, i)
        store.append(muts, state)                    # written; the process dies before its fsync
        for m in muts:
            state.apply(m)
    os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def watch_fsyncs(path: Path, images: list[bytes]) -> Iterator[None]:
    """Every fsync of the file at path (by inode) appends the file's bytes, as they were made durable, to images."""
    real = os.fsync

    def fsync(fd: int | HasFileno) -> None:
        real(fd)
        number = fd if isinstance(fd, int) else fd.fileno()
        if path.exists() and os.fstat(number).st_ino == path.stat().st_ino:
            images.append(path.read_bytes())

    os.fsync = fsync
    try:
        yield
    finally:
        os.fsync = real


def _load(directory: Path) -> State:
    store = EmbeddedStore(directory, fsync="always")
    try:
        return store.load()
    finally:
        store.close()


def run_case(seed: int, root: Path, fingerprint: Callable[[State], object]) -> tuple[object, object, str]:
    """(what the restarted store served, what a power loss after it left, a line saying what happened)."""
    directory = root / "buffer"
    directory.mkdir(parents=True)
    writer = subprocess.run([sys.executable, "-m", "tests.faults.restart_power_loss", "--write", str(directory),
                             "--seed", str(seed)], capture_output=True, text=True, timeout=120)
    assert writer.returncode == -signal.SIGKILL, f"writer: rc {writer.returncode}\n{writer.stderr}"
    path = directory / LOG_NAME
    images = [(root / DURABLE).read_bytes()]
    with watch_fsyncs(path, images):
        store = EmbeddedStore(directory, fsync="always")    # the restart
        served = fingerprint(store.load())
        durable = images[-1]                                 # power loss now: the last fsync's bytes survive
    store.close()
    path.write_bytes(durable)
    after = fingerprint(_load(directory))
    line = (f"seed {seed}: {len(images) - 1} fsyncs of the log on restart; durable image {len(durable)} bytes; "
            f"served state {'kept' if after == served else 'LOST'} by the power loss")
    return served, after, line


def main() -> int:
    from tests.unit.test_buffer_durability import fingerprint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    if args.write is not None:
        write_then_die(args.write, args.seed)
    lost = 0
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            served, after, line = run_case(seed, Path(tmp), fingerprint)
        print(line)
        lost += served != after
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
