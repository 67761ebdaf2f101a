"""`rlfleet buffer verify|salvage RUN_DIR`: report what the embedded log holds, and recover what is intact.

verify reads RUN_DIR/buffer/buffer.log and says whether it is intact, ends in a torn tail (cut at the next start),
or is corrupt (a bad frame with intact commits after it, or a damaged last commit that no torn write leaves, or a
commit that does not replay: the buffer refuses to start); it exits non-zero exactly then, when acknowledged history
may be lost. An all-zero log is a torn tail at offset 0 (no commit ever completed): verify, salvage and the buffer
agree that it starts empty. salvage rebuilds the state
from the intact commits before the damage plus every intact commit after it that still applies on top (in order;
one that does not is skipped and reported), keeps the damaged file as buffer.log.corrupt-N and writes the
salvaged state as a fresh log. A commit whose sequence number repeats one already applied (a duplicated frame) is
corruption to verify and is dropped by salvage (never applied twice); one that skips numbers is reported as missing
commits and, if it applies, kept. The buffer must not be running (the log's lock says so).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores import StoreError
from rlfleet.services.buffer.stores.embedded import (
    LOG_NAME,
    LogCorrupt,
    commit_parts,
    first_seq,
    keep_beside,
    read_frame,
    replay,
)
from rlfleet.services.buffer.stores.logfile import AppendLog, Scan, body_at, frame_parts, replace_with, scan, scan_bytes


def log_path(run_dir: Path) -> Path:
    return Path(run_dir) / "buffer" / LOG_NAME


@dataclass(frozen=True)
class Report:
    text: str
    ok: bool              # nothing needs salvaging (intact, or a torn tail the next start cuts)


def _summary(state: State) -> str:
    text = (f"{len(state.open)} open, {len(state.ready)} ready, {len(state.delivered)} delivered groups; "
            f"committed step {state.committed_step}, cursor {state.next_prompt_index}")
    reasons = state.quarantine_reasons()
    if reasons:
        text += f"; {len(state.quarantined)} quarantined groups (" + "; ".join(
            f"{n}: {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]) + ")"
    return text


def verify(run_dir: Path) -> Report:
    path = log_path(run_dir)
    if not path.exists():
        return Report(f"{path}: no log (the buffer never wrote one)", True)
    result = scan(path)
    lines = [result.describe()]
    ok = result.damage is None or result.damage.torn_tail
    try:
        lines.append(f"intact prefix replays to: {_summary(replay(result))}")
    except StoreError as exc:
        lines.append(str(exc))
        ok = False
    if not ok:
        lines.append("the buffer will refuse to start; `rlfleet buffer salvage RUN_DIR` recovers the intact commits")
    return Report("\n".join(lines), ok)


def _later_frames(result: Scan, data: bytes) -> list[tuple[int, bytes]]:
    """The intact frames after the damage, in order."""
    if result.damage is None:
        return []
    return [(at, body_at(data, at)) for at in result.damage.intact_after]


def _replays(result: Scan) -> bool:
    try:
        replay(result)
    except LogCorrupt:
        return False
    return True


@dataclass
class _Rebuilt:
    state: State
    kept_before: int = 0      # commits of the intact prefix applied
    kept_after: int = 0       # intact commits after the damage applied
    notes: list[str] = field(default_factory=list)    # each commit not applied, and each gap in the numbers


def _rebuild(result: Scan, later: list[tuple[int, bytes]]) -> _Rebuilt:
    """The state of the intact prefix's commits, then of each later intact commit that applies on top, in order.
    A commit whose number repeats one applied is dropped (a duplicated frame); a prefix commit that does not apply
    is refused (LogCorrupt), a later one skipped. Every drop or gap is reported in skipped."""
    out, last = _Rebuilt(State()), -1
    skipped = out.notes
    sequenced = first_seq(result) is not None
    for i, (offset, body) in enumerate([*result.frames, *later]):
        prefix = i < len(result.frames)
        try:
            seq, muts = read_frame(body, result.legacy)
        except Exception as exc:   # a commit that does not decode
            if prefix:
                raise LogCorrupt(f"{result.path}: commit at offset {offset} cannot be replayed: "
                                 f"{type(exc).__name__}: {exc}") from exc
            skipped.append(f"offset {offset}: {type(exc).__name__}: {exc}")
            continue
        if sequenced and seq is not None and seq <= last:
            skipped.append(f"offset {offset}: repeats commit {seq} (a duplicated frame; not applied twice)")
            continue
        if sequenced and seq is not None and seq > last + 1:
            skipped.append(f"offset {offset}: commits {last + 1}..{seq - 1} are missing before it (numbered {seq})")
        if prefix:
            for m in muts:
                out.state.apply(m)
            out.kept_before += 1
        else:
            trial = copy.deepcopy(out.state)
            try:
                for m in muts:
                    trial.apply(m)
            except Exception as exc:   # a commit that needed what the damage took: skipped, reported
                skipped.append(f"offset {offset}: {type(exc).__name__}: {exc}")
                continue
            out.state, out.kept_after = trial, out.kept_after + 1
        last = seq if seq is not None else last
    return out


def salvage(run_dir: Path) -> Report:
    path = log_path(run_dir)
    if not path.exists():
        return Report(f"{path}: no log to salvage", True)
    lock = AppendLog(path, path.stat().st_size, truncate=False)    # RuntimeError while a buffer holds it
    try:
        data = path.read_bytes()
        result = scan_bytes(path, data)
        damaged = result.damage is not None and not result.damage.torn_tail
        if not damaged and _replays(result):
            return Report(f"{result.describe()}; nothing to salvage (a torn tail is cut at the next start)", True)
        rebuilt = _rebuild(result, _later_frames(result, data) if damaged else [])
        state = rebuilt.state
        keep = keep_beside(path, "corrupt")        # a hard link to the damaged file, renamed over next
        replace_with(path, frame_parts(commit_parts(state.snapshot(), 0))).close()
    finally:
        lock.close()
    lines = [result.describe(),
             f"salvaged {rebuilt.kept_before} commits before the damage and {rebuilt.kept_after} after it; "
             f"{len(rebuilt.notes)} notes",
             *[f"  {note}" for note in rebuilt.notes],
             f"state now: {_summary(state)}", f"the damaged log is kept as {keep}"]
    return Report("\n".join(lines), True)


def main(argv: list[str] | None = None) -> int:
    """python -m rlfleet.services.buffer.stores.repair verify|salvage RUN_DIR (what `rlfleet buffer` runs)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("verify", "salvage"):
        print("usage: python -m rlfleet.services.buffer.stores.repair verify|salvage RUN_DIR", file=sys.stderr)
        return 2
    action, run_dir = args
    try:
        report = verify(Path(run_dir)) if action == "verify" else salvage(Path(run_dir))
    except (OSError, RuntimeError) as exc:
        print(f"rlfleet buffer {action}: {exc}", file=sys.stderr)
        return 2
    print(report.text)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
