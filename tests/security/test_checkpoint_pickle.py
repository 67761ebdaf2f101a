"""A crafted pickle planted in a checkpoint folder is refused with a clear error, and nothing it carries runs."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlfleet.runtime.ports import free_ports
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.distributed_exit import leave_distributed


class _Payload:
    """Unpickling this would run os.system and create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


@pytest.fixture()
def group() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_ports(1)[0]}", rank=0, world_size=1)
    yield
    leave_distributed()


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    return m, opt


def _rehash(folder: Path) -> None:
    """What an attacker with write access does: make checksums.json agree with the planted files."""
    sums = {str(p.relative_to(folder)): {"xxh64": checkpoint._file_hash(p), "bytes": p.stat().st_size}
            for p in checkpoint._files(folder)}
    (folder / checkpoint.CHECKSUMS).write_text(json.dumps(sums))


def test_planted_metadata_pickle_is_refused_and_does_not_run(tmp_path: Path, group: None) -> None:
    model, opt = _model()
    checkpoint.save(tmp_path, 3, 1, model, opt, torch.device("cpu"), keep=5)
    info = checkpoint.latest(tmp_path)
    assert info is not None and info.step == 3
    fresh, fresh_opt = torch.nn.Linear(4, 3), torch.optim.AdamW(torch.nn.Linear(4, 3).parameters())
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    checkpoint.load(info, fresh, fresh_opt, torch.device("cpu"))            # the genuine one loads (safe reader)
    assert torch.equal(fresh.weight, model.weight)

    planted = checkpoint.step_dir(tmp_path, 999)
    planted.mkdir(parents=True)
    for p in checkpoint._files(info.path):
        dest = planted / p.relative_to(info.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(p.read_bytes())
    meta = json.loads((planted / checkpoint.META).read_text())
    (planted / checkpoint.META).write_text(json.dumps({**meta, "step": 999}))
    marker = tmp_path / "payload-ran"
    (planted / checkpoint.STATE / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    _rehash(planted)

    found = checkpoint.latest(tmp_path)
    assert found is not None and found.step == 999                 # checksums alone cannot tell it apart
    with pytest.raises(checkpoint.CheckpointError, match=r"refuses to load global (posix|os)\.system"):
        checkpoint.load(found, fresh, fresh_opt, torch.device("cpu"))
    assert not marker.exists()


def test_planted_non_tensor_item_is_loaded_weights_only(tmp_path: Path, group: None) -> None:
    """DCP's default planner reads non-tensor items with torch.load(weights_only=False); ours refuses a payload."""
    model, opt = _model()
    path = checkpoint.save(tmp_path, 1, 1, model, opt, torch.device("cpu"), keep=5)
    marker = tmp_path / "payload-ran"
    from rlfleet.security.safe_unpickle import SafeFileSystemReader

    md = SafeFileSystemReader(str(path / checkpoint.STATE)).read_metadata()
    lr_key = next(k for k in md.state_dict_metadata if k.endswith("param_groups.0.lr"))
    info = md.storage_data[next(i for i in md.storage_data if i.fqn == lr_key)]
    data_file = path / checkpoint.STATE / info.relative_path
    blob = bytearray(data_file.read_bytes())
    import io

    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)
    evil = buf.getvalue()
    assert len(evil) >= info.length, "payload must fit where the item was"
    # write the payload in place of the item (its offset/length live in the pickled metadata we do not rewrite)
    # by appending it and pointing the metadata there, as an attacker who rewrites both would
    offset = len(blob)
    blob += evil
    data_file.write_bytes(bytes(blob))
    md.storage_data[next(i for i in md.storage_data if i.fqn == lr_key)] = type(info)(
        relative_path=info.relative_path, offset=offset, length=len(evil))
    md.storage_meta = None
    (path / checkpoint.STATE / ".metadata").write_bytes(pickle.dumps(md))
    _rehash(path)
    found = checkpoint.latest(tmp_path)
    assert found is not None
    fresh = torch.nn.Linear(4, 3)
    with pytest.raises(checkpoint.CheckpointError, match="Weights only load failed"):
        checkpoint.load(found, fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3), torch.device("cpu"))
    assert not marker.exists()


def test_resume_takes_only_checkpoints_the_trainer_sealed(tmp_path: Path, group: None) -> None:
    from rlfleet.security.signing import Signer, Verifier, generate_signing_key
    from rlfleet.services.trainer.checkpoint_seal import latest_sealed, seal

    generate_signing_key(tmp_path / "k", tmp_path / "k.pub")
    signer, verifier = Signer.from_file(tmp_path / "k"), Verifier.from_file(tmp_path / "k.pub")
    model, opt = _model()
    genuine = checkpoint.save(tmp_path, 3, 1, model, opt, torch.device("cpu"), keep=5)
    seal(genuine, signer)
    planted = checkpoint.step_dir(tmp_path, 999)
    for p in checkpoint._files(genuine):
        dest = planted / p.relative_to(genuine)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(p.read_bytes())
    meta = json.loads((planted / checkpoint.META).read_text())
    (planted / checkpoint.META).write_text(json.dumps({**meta, "step": 999}))
    _rehash(planted)                                   # checksums agree, the copied seal does not
    assert checkpoint.latest(tmp_path).step == 999     # type: ignore[union-attr]
    found = latest_sealed(tmp_path, verifier)
    assert found is not None and found.step == 3
    (genuine / checkpoint.META).write_text(json.dumps({**meta, "version": 77}))
    _rehash(genuine)
    assert latest_sealed(tmp_path, verifier) is None   # an edited file breaks the seal


class _Reduced:
    """Pickles as `fn(*args)`: how some Pythons (Debian's 3.11.2, 3.12+) pickle an enum member (getattr)."""

    def __init__(self, fn: object, args: tuple[object, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.fn, self.args


def test_enum_members_pickled_by_getattr_load_and_nothing_else_does() -> None:
    from pathlib import PosixPath

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from rlfleet.security.safe_unpickle import UnsafePickleError, restricted_load

    member = _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    data = pickle.dumps([_Reduced(getattr, (_MEM_FORMAT_ENCODING, member.name))])
    assert b"getattr" in data
    assert restricted_load(data, "m") == [member]
    for fn_args in ((PosixPath, "cwd"), (_MEM_FORMAT_ENCODING, "__class__"), (_MEM_FORMAT_ENCODING, "_missing_")):
        with pytest.raises(UnsafePickleError, match="refuses getattr"):
            restricted_load(pickle.dumps(_Reduced(getattr, fn_args)), "m")
