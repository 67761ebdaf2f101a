"""The run mode's ledger from durable evidence only: what the buffer's store held, what the trainer committed.

put      every sample id the store ever held: the embedded log's Add records (the log is append-only; it is only
         rewritten by compaction past 64 MiB, which a harness run never reaches), or for Redis the XADDs to the
         samples stream in redis-server's AOF (appendonly, no rewrite below 64 MiB)
trained  the committed_ids_rank*.json of every complete checkpoint (rlfleet/run_dir/committed_ids.py), per step: an id
in two
         checkpoints was trained twice
dropped  the store's drop counters by reason (State.dropped, persisted with every commit); with the embedded store
         also per sample id, from the log's records that drop samples (Close, Stale, Cancel, Quarantine)
stored   ids still in the store at the end (open groups' samples, ready and delivered groups' kept samples)
"""

from __future__ import annotations

import json
from pathlib import Path

from rlfleet.run_dir.committed_ids import complete_step
from rlfleet.services.buffer.mutations import Add, Cancel, Close, Quarantine, Stale
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores import Store
from rlfleet.services.buffer.stores.embedded import LOG_NAME, EmbeddedStore, decode_commit
from rlfleet.services.buffer.stores.logfile import scan


def complete_steps(run_dir: Path) -> dict[int, list[str]]:
    """step -> the sample ids its complete checkpoint committed (every rank's file)."""
    out: dict[int, list[str]] = {}
    root = run_dir / "checkpoints"
    for path in sorted(root.glob("step_*")) if root.is_dir() else []:
        step = complete_step(path)
        if step is None:
            continue
        ids: list[str] = []
        for f in sorted(path.glob("committed_ids_rank*.json")):
            ids.extend(str(i) for i in json.loads(f.read_text()))
        out[step] = ids
    return out


def embedded_put_ids(run_dir: Path) -> set[str]:
    """Every sample id an Add record of the embedded log carries (a torn tail is ignored, as replay does)."""
    result = scan(run_dir / "buffer" / LOG_NAME)
    return {f"{m.gid}/{m.index}" for _, body in result.frames for m in decode_commit(body) if isinstance(m, Add)}


def embedded_dropped_ids(run_dir: Path) -> dict[str, str]:
    """sample id -> the reason the embedded log's records dropped it with (a Close naming several reasons for its
    dropped samples: those reasons joined with '+')."""
    added: dict[str, set[int]] = {}
    kept: dict[str, tuple[int, ...]] = {}
    out: dict[str, str] = {}
    for _, body in scan(run_dir / "buffer" / LOG_NAME).frames:
        for m in decode_commit(body):
            if isinstance(m, Add):
                added.setdefault(m.gid, set()).add(m.index)
            elif isinstance(m, Close):
                kept[m.gid] = m.kept
                reason = "+".join(sorted(m.drops)) or "closed"
                out.update({f"{m.gid}/{i}": reason for i in added.get(m.gid, set()) - set(m.kept)})
            elif isinstance(m, Cancel):
                out.update({f"{m.gid}/{i}": m.reason for i in m.indices})
            elif isinstance(m, Stale | Quarantine):
                out.update({f"{g}/{i}": m.reason for g in m.gids for i in kept.get(g, ())})
    return out


def _resp_commands(data: bytes) -> list[list[bytes]]:
    """The commands of an AOF file (RESP arrays of bulk strings); a torn last command is ignored."""
    out: list[list[bytes]] = []
    pos = 0
    try:
        while pos < len(data):
            if data[pos:pos + 1] != b"*":          # e.g. a MULTI-less inline line: skip to the next line
                pos = data.index(b"\r\n", pos) + 2
                continue
            end = data.index(b"\r\n", pos)
            n = int(data[pos + 1:end])
            pos = end + 2
            args = []
            for _ in range(n):
                end = data.index(b"\r\n", pos)
                size = int(data[pos + 1:end])
                pos = end + 2
                if pos + size > len(data):
                    raise ValueError("torn")
                args.append(data[pos:pos + size])
                pos += size + 2
            out.append(args)
    except ValueError:
        pass
    return out


def redis_put_ids(redis_dir: Path, samples_key: str) -> set[str]:
    """Every sample id an XADD to `samples_key` in redis-server's AOF carries (fields g, i)."""
    ids: set[str] = set()
    files = sorted((redis_dir / "appendonlydir").glob("*.aof")) or sorted(redis_dir.glob("*.aof"))
    for f in files:
        for cmd in _resp_commands(f.read_bytes()):
            if len(cmd) < 4 or cmd[0].upper() != b"XADD" or cmd[1] != samples_key.encode():
                continue
            fields = dict(zip(cmd[3::2], cmd[4::2], strict=False))
            if b"g" in fields and b"i" in fields:
                ids.add(f"{fields[b'g'].decode()}/{int(fields[b'i'])}")
    return ids


def load_state(run_dir: Path, redis_url: str | None, prefix: str) -> State:
    """The store's state once the run is over (no buffer is running)."""
    store: Store
    if redis_url is not None:
        from rlfleet.services.buffer.stores.redis_streams import RedisStore

        store = RedisStore(redis_url, prefix=prefix)
    else:
        store = EmbeddedStore(run_dir / "buffer")
    try:
        return store.load()
    finally:
        store.close()


def stored_ids(state: State) -> set[str]:
    return ({f"{g.gid}/{i}" for g in state.open.values() for i in g.samples}
            | {f"{g.gid}/{i}" for g in (*state.ready.values(), *state.delivered.values()) for i in g.kept})
