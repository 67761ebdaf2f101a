"""A trainer's lineage: the chain of trainer incarnations (epochs) whose weights its current policy descends from.

Each incarnation publishes under its own epoch (`WeightManifest.epoch`, its start time in ms) and starts from the
version of the checkpoint it resumed (its base). A trainer that died after publishing versions its last checkpoint
does not hold leaves those versions behind: the next incarnation re-publishes the same version numbers with other
weights. Samples therefore name the epoch of their weights (`Sample.weight_epoch`), and a sample `(e, v)` belongs to
the lineage when e is one of its epochs and v is at most the base of every later epoch; epoch 0 is the initial
weights, which every lineage shares up to its first base. The buffer drops the rest (reason `abandoned_lineage`).

The trainer keeps its lineage in `RUN/trainer/lineage.json` (written atomically: temp file, fsync, rename), extended by
`extend` each time it starts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlfleet.run_dir.atomic import write_text_atomic

FILE_NAME = "lineage.json"


@dataclass(frozen=True)
class Epoch:
    epoch: int            # WeightManifest.epoch of one trainer incarnation
    base_version: int     # the version it resumed from (0 for a fresh start)


def extend(lineage: Sequence[Epoch], epoch: int, base_version: int) -> list[Epoch]:
    """The lineage of a new incarnation that resumed at base_version: every earlier epoch whose base is past
    base_version is dropped (that incarnation started after the checkpoint resumed from was written, so none of its
    versions are ancestors), then the new epoch is appended."""
    kept = [e for e in lineage if e.base_version <= base_version and e.epoch != epoch]
    return [*kept, Epoch(epoch, base_version)]


def allows(lineage: Sequence[Epoch], epoch: int, version: int) -> bool:
    """Whether weights (epoch, version) are of this lineage (oldest first). An empty lineage allows everything."""
    if not lineage:
        return True
    if epoch == 0:                                   # the initial weights: shared up to the first base
        return version <= lineage[0].base_version
    for i, e in enumerate(lineage):
        if e.epoch == epoch:
            return all(version <= later.base_version for later in lineage[i + 1:])
    return False


def load(path: Path) -> list[Epoch]:
    """The lineage stored at path, or [] when there is none yet. A file that is not a lineage is an error."""
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())["lineage"]
        return [Epoch(int(r["epoch"]), int(r["base_version"])) for r in rows]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a trainer lineage file ({exc})") from None


def save(path: Path, lineage: Sequence[Epoch]) -> None:
    body = {"lineage": [{"epoch": e.epoch, "base_version": e.base_version} for e in lineage]}
    write_text_atomic(path, json.dumps(body, indent=1) + "\n")
