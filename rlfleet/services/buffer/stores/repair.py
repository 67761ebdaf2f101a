"""`rlfleet buffer verify|salvage RUN_DIR`: report what the embedded log holds, and recover what is intact.

verify reads RUN_DIR/buffer/buffer.log and says whether it is intact, ends in a torn tail (cut at the next start),
or is corrupt (a bad frame with intact commits after it, or a damaged last commit that no torn write leaves, or a
commit that does not replay: the buffer refuses to start); it exits non-zero exactly then, when acknowledged history
may be lost. An all-zero log is a torn tail at offset 0 (no commit ever completed): verify, salvage and the buffer
agree that it starts empty. salvage rebuilds the state
from the intact commits before the damage plus every intact commit after it that still applies on top (in order;
one that does not is skipped and reported), keeps the damaged file as buffer.log.corrupt-N and writes the
salvaged state as a fresh log. The buffer must not be running (the log's lock says so).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores import StoreError
from rlfleet.services.buffer.stores.embedded import LOG_NAME, commit_parts, decode_commit, keep_beside, replay
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
    assert result.damage is not None
    return [(at, body_at(data, at)) for at in result.damage.intact_after]


def salvage(run_dir: Path) -> Report:
    path = log_path(run_dir)
    if not path.exists():
        return Report(f"{path}: no log to salvage", True)
    lock = AppendLog(path, path.stat().st_size, truncate=False)    # RuntimeError while a buffer holds it
    try:
        data = path.read_bytes()
        result = scan_bytes(path, data)
        if result.damage is None or result.damage.torn_tail:
            return Report(f"{result.describe()}; nothing to salvage (a torn tail is cut at the next start)", True)
        state = replay(Scan(path, result.size, result.frames, result.end, None, result.legacy))
        kept, skipped = 0, []
        for offset, body in _later_frames(result, data):
            trial = copy.deepcopy(state)
            try:
                for m in decode_commit(body):
                    trial.apply(m)
            except Exception as exc:   # a commit that needed what the damage took: skipped, reported
                skipped.append(f"offset {offset}: {type(exc).__name__}: {exc}")
                continue
            state, kept = trial, kept + 1
        keep = keep_beside(path, "corrupt")        # a hard link to the damaged file, renamed over next
        replace_with(path, frame_parts(commit_parts(state.snapshot()))).close()
    finally:
        lock.close()
    lines = [result.describe(),
             f"salvaged {len(result.frames)} commits before the damage and {kept} after it; skipped {len(skipped)}",
             *[f"  skipped {s}" for s in skipped],
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
