"""Trainer checkpoints: RUN_DIR/checkpoints/step_XXXXXXXX/ holding sharded model+optimizer (torch DCP; auxiliary
trained models such as PPO's critic beside them), every rank's RNG state, the sample ids each rank trained on since
the previous checkpoint (committed_ids_rankNNNNN.json), JSON state (e.g. scheduler.json), meta.json (step,
version, extra fields) and checksums.json. DCP reshards on load, so a checkpoint resumes on another process count.
Written to a temp folder and renamed into place only after every rank finished; `latest` ignores anything
incomplete.
"""

from __future__ import annotations

import json
import logging
import os
import pickle  # for its exception type only: nothing here calls pickle.load
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlfleet.run_dir.atomic import fsync_dir, write_bytes_atomic, write_text_atomic
from rlfleet.run_dir.committed_ids import committed_ids_name, complete_meta
from rlfleet.security.safe_unpickle import SafeFileSystemReader, SafeLoadPlanner

log = logging.getLogger(__name__)

META = "meta.json"
CHECKSUMS = "checksums.json"
STATE = "state"
PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or corrupt."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    version: int
    world_size: int


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"{PREFIX}{step:08d}"


def _file_hash(path: Path) -> str:
    h = xxhash.xxh64()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def write_rng_states(folder: Path, rank: int, device: torch.device) -> None:
    """This rank's RNG states (CPU, and CUDA on a CUDA device) as rng_<kind>_rankNNNNN.bin: both backends' format."""
    states = {"cpu": torch.get_rng_state().numpy().tobytes()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device).numpy().tobytes()
    for kind, data in states.items():
        write_bytes_atomic(folder / f"rng_{kind}_rank{rank:05d}.bin", data)


def restore_rng_states(folder: Path, rank: int, device: torch.device) -> None:
    """The RNG states write_rng_states saved for this rank, where they exist (a rank new to the run keeps its own)."""
    for kind in ("cpu", "cuda"):
        path = folder / f"rng_{kind}_rank{rank:05d}.bin"
        if not path.exists():
            continue
        state = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
        if kind == "cpu":
            torch.set_rng_state(state)
        elif device.type == "cuda":
            torch.cuda.set_rng_state(state, device)


def publish_folder(run_dir: Path, tmp: Path, final: Path, keep: int) -> None:
    """Rank 0, every file written into tmp: checksums of them all, then tmp renamed to final (a folder of the same step
    replaced), the rename made durable, and checkpoints beyond `keep` pruned. Both backends finish a save here."""
    sums = {str(p.relative_to(tmp)): {"xxh64": _file_hash(p), "bytes": p.stat().st_size} for p in _files(tmp)}
    write_text_atomic(tmp / CHECKSUMS, json.dumps(sums, indent=1))
    if final.exists():                      # the same step saved again (e.g. resumed, then asked to save)
        old = final.with_name(f".old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        shutil.rmtree(old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    prune(run_dir, keep)


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               aux: Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer]]) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    for name, (m, o) in aux.items():
        state[name], state[f"{name}_optim"] = get_state_dict(m, o)
    return state


Aux = Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer]]


def save(run_dir: Path, step: int, version: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         device: torch.device, keep: int, aux: Aux | None = None,
         json_state: Mapping[str, Any] | None = None, meta_extra: Mapping[str, Any] | None = None,
         sample_ids: Sequence[str] | None = None, files: Mapping[str, bytes] | None = None) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint folder.

    aux: more (model, optimizer) pairs saved under their name; json_state: name -> JSON-able state written by rank 0
    as NAME.json; meta_extra: fields added to meta.json; sample_ids: what this rank trained on since the last save;
    files: relative path -> bytes written by rank 0 (e.g. hf/config.json, for `rlfleet convert`).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    aux, json_state, meta_extra, files = aux or {}, json_state or {}, meta_extra or {}, files or {}
    final = step_dir(run_dir, step)
    tmp = final.with_name(f".tmp-{final.name}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    try:
        dcp.save(_dcp_state(model, optimizer, aux), checkpoint_id=str(tmp / STATE))
        write_rng_states(tmp, rank, device)
        if sample_ids is not None:
            write_text_atomic(tmp / committed_ids_name(rank), json.dumps(list(sample_ids)))
    except (Exception, CheckpointException) as exc:   # DCP's exception is a BaseException: it escaped every handler
        raise write_failed(step, tmp, exc, rank == 0) from exc
    dist.barrier()
    if rank == 0:
        try:
            _finish(run_dir, tmp, final, step, version, world, keep, json_state, meta_extra, files)
        except Exception as exc:
            raise write_failed(step, tmp, exc, True) from exc
    dist.barrier()
    return final


def _finish(run_dir: Path, tmp: Path, final: Path, step: int, version: int, world: int, keep: int,
            json_state: Mapping[str, Any], meta_extra: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
    """Rank 0, once every rank's files are in tmp: JSON state, files, meta, checksums, then the rename."""
    for name, value in json_state.items():
        write_text_atomic(tmp / f"{name}.json", json.dumps(value, indent=1))
    for rel, data in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(tmp / rel, data)
    meta = {"step": step, "version": version, "world_size": world, "torch": torch.__version__, **meta_extra}
    write_text_atomic(tmp / META, json.dumps(meta, indent=1))
    publish_folder(run_dir, tmp, final, keep)


def _root_cause(exc: BaseException) -> BaseException:
    """DCP wraps each rank's error (with its traceback) in a CheckpointException: the first rank's own error."""
    if isinstance(exc, CheckpointException) and exc.failures:
        return next(iter(exc.failures.values()))[0]
    return exc


def write_failed(step: int, tmp: Path, exc: BaseException, remove: bool) -> CheckpointError:
    """The error for a checkpoint that could not be written (most often a full disk): says why, how much space is
    left and what is kept; the partial folder is removed first (remove: rank 0), so it does not hold the space."""
    if remove:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        free = f"{shutil.disk_usage(tmp.parent).free / 2**20:.1f} MiB free on its disk"
    except OSError as error:
        free = f"free space unknown: {error}"
    cause = _root_cause(exc)
    return CheckpointError(
        f"checkpoint of step {step} could not be written to {tmp.parent} ({free}): {type(cause).__name__}: "
        f"{str(cause).strip()}. Nothing acknowledged is lost: the last complete checkpoint stays, and the buffer "
        "keeps every sample trained since it until a checkpoint is written. Free space, then run again with "
        "--resume.")


def prune(run_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints, and leftover temp folders."""
    root = checkpoints_dir(run_dir)
    for leftover in root.glob(".tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    complete = [c.path for c in _complete(root)]
    for path in complete[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def _read_info(path: Path) -> CheckpointInfo | None:
    """Info of a complete checkpoint (meta and checksums present, every listed file there with its size)."""
    meta = complete_meta(path)
    if meta is None:
        return None
    return CheckpointInfo(path=path, step=int(meta["step"]), version=int(meta["version"]),
                          world_size=int(meta["world_size"]))


def _complete(root: Path) -> list[CheckpointInfo]:
    """Complete checkpoints under root, newest step first."""
    infos = []
    for path in root.glob(f"{PREFIX}*") if root.is_dir() else []:
        info = _read_info(path)
        if info is not None:
            infos.append(info)
    return sorted(infos, key=lambda i: i.step, reverse=True)


def latest(run_dir: Path) -> CheckpointInfo | None:
    """The newest complete checkpoint of the run, or None."""
    found = _complete(checkpoints_dir(run_dir))
    return found[0] if found else None


def verify(path: Path) -> None:
    """Raise CheckpointError when a file's checksum disagrees with checksums.json."""
    sums = json.loads((path / CHECKSUMS).read_text())
    for rel, entry in sums.items():
        if _file_hash(path / rel) != entry["xxh64"]:
            raise CheckpointError(f"checkpoint {path}: {rel} does not match its checksum")


def read_json_state(info: CheckpointInfo, name: str) -> Any | None:
    """NAME.json of a checkpoint (json_state of save), or None when absent."""
    path = info.path / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def read_meta(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / META).read_text())


def committed_sample_ids(path: Path) -> list[str]:
    """The sample ids every rank trained on in the steps this checkpoint committed (since the previous one)."""
    ids: list[str] = []
    for f in sorted(Path(path).glob("committed_ids_rank*.json")):
        ids.extend(json.loads(f.read_text()))
    return ids


def load(info: CheckpointInfo, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         device: torch.device, aux: Aux | None = None) -> None:
    """Collective: restore model, optimizer (and aux pairs) and this rank's RNG state from a checkpoint."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = torch.ones(1, device=device)
    error = ""
    if rank == 0:
        try:
            verify(info.path)
        except (CheckpointError, OSError, ValueError) as exc:
            ok.zero_()
            error = str(exc)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if not ok.item():
        raise CheckpointError(error or f"checkpoint {info.path} failed verification on rank 0")
    aux = aux or {}
    state = _dcp_state(model, optimizer, aux)
    reader = SafeFileSystemReader(str(info.path / STATE))
    try:                        # nothing in the folder is unpickled beyond DCP's metadata types and weights_only items
        reader.read_metadata()
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
    except (pickle.UnpicklingError, CheckpointException) as exc:
        raise CheckpointError(f"checkpoint {info.path} refused: {exc}") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for name, (m, o) in aux.items():
        set_state_dict(m, o, model_state_dict=state[name], optim_state_dict=state[f"{name}_optim"])
    if info.world_size != world:
        log.warning("checkpoint %s was written by %d ranks, resuming on %d: RNG states of new ranks are not restored",
                    info.path, info.world_size, world)
    restore_rng_states(info.path, rank, device)
